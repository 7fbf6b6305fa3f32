"""Ids written into files keep their values whatever module holds them now: pipeline, checkpoint and
student format ids, the student graph's id and `retrieval.json`'s code field name where the code was when
the first such file was written, and files written then must still read (a module move changes none)."""

from pathlib import Path

from encoder_study.encoders import trainable
from encoder_study.encoders.trainable import words
from encoder_study.recipes.retrieval import export as retrieval_export
from encoder_study.recipes.student import distill
from encoder_study.recipes.student import export as student_export
from encoder_study.recipes.tagging import pipeline, train


def test_format_ids_keep_the_values_files_were_written_with():
    assert pipeline.FORMATS == ("encoder_study.tagging.pipeline/1", "encoder_study.tagging.pipeline/2",
                                "encoder_study.tagging.pipeline/3")
    assert pipeline.METADATA_KEY == "encoder_study.pipeline"
    assert train.CHECKPOINT_FORMAT == "encoder_study.tagging.train/2"
    assert trainable.CHECKPOINT_FORMAT == "encoder_study.trainable/1"
    assert words.CHECKPOINT_FORMAT == "encoder_study.trainable.words/1"
    assert distill.CHECKPOINT_FORMAT == "encoder_study.distill.train/1"
    assert distill.STUDENT_FORMAT == "encoder_study.distill.student/1"
    assert student_export.GRAPH_ID == "encoder_study.distill.export.StudentGraph"


def test_retrieval_json_names_the_reference_code_as_before():
    source = Path(retrieval_export.__file__).read_text(encoding="utf-8")  # written by the export itself
    assert '"code": "encoder_study.retrieval.check.reference"' in source

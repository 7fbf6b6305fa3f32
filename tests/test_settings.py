"""Settings spelled once (core/settings.py): a dataclass's options are generated, the rule's flags are
rendered from the config, and the command reads back the same object; the fragment records the group
under one name."""

import argparse
import shlex
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

import pytest

from encoder_study.core import settings
from encoder_study.recipes.tagging import command as tagging_command
from encoder_study.recipes.tagging.settings import Bootstrap, Training
from encoder_study.recipes.writeback import command as writeback_command


@dataclass(frozen=True)
class Example:
    steps: int
    rate: float
    name: str
    on: bool

    OPTIONS: ClassVar[dict] = {"steps": "steps", "name": ("a name", ("a", "b c"))}


def test_flags_parse_back_to_the_same_settings():
    parser = argparse.ArgumentParser()
    settings.add_options(parser, Example, "ex")
    for given in (Example(3, 0.5, "b c", True), Example(0, 1e-5, "a", False)):
        argv = settings.flags(Example, asdict(given), "ex")
        assert settings.from_args(Example, parser.parse_args(shlex.split(argv)), "ex") == given
    with pytest.raises(SystemExit):  # every option is required: defaults live in the schema
        parser.parse_args(["--ex-steps", "1"])
    with pytest.raises(SystemExit):  # the choices are the class's
        parser.parse_args(["--ex-steps", "1", "--ex-rate", "1", "--ex-name", "c", "--ex-on"])
    with pytest.raises(KeyError, match="no value for rate"):
        settings.flags(Example, {"steps": 1, "name": "a", "on": True}, "ex")


def test_a_commands_bootstrap_is_the_configs(capsys):
    """What a rule renders from tagging.bootstrap is what `tagging tables` and `writeback agreement`
    read; `predict` (run by hand) has defaults instead."""
    config = {"resamples": 1234, "seed": 7, "confidence": 0.9, "method": "bca"}
    rendered = settings.flags(Bootstrap, config, "bootstrap").split()
    tables = tagging_command.parser().parse_args([
        "tables", "--task", "upos", "--run-dir", "r", "--scores-out", "s.csv", "--caption", "",
        "--provenance", "p.md", *rendered])
    assert settings.from_args(Bootstrap, tables, "bootstrap") == Bootstrap(**config)
    agreement = writeback_command.parser().parse_args(["agreement", "--run", "r", "a", "b", "--test", "t",
                                         "--pred-dir", "d", "--out", "o.csv", "--threads", "1",
                                         "--provenance", "p.md", *rendered])
    assert settings.from_args(Bootstrap, agreement, "bootstrap") == Bootstrap(**config)
    predict = tagging_command.parser().parse_args(["predict", "--pipeline", "p", "--input", "i",
                                                   "--out", "o"])
    assert settings.from_args(Bootstrap, predict, "bootstrap").resamples == 1000
    recorded = settings.recorded({"bootstrap_resamples": 1234, "bootstrap_seed": 7, "out": "o"},
                                 Bootstrap, "bootstrap")
    assert recorded == {"bootstrap": {"resamples": 1234, "seed": 7}, "out": "o"}


@pytest.mark.parametrize("group", [Bootstrap, Training])
def test_every_setting_says_what_it_is(group):
    assert set(group.OPTIONS) == {f.name for f in fields(group)}
    for described in group.OPTIONS.values():
        help_ = described[0] if isinstance(described, tuple) else described
        assert help_ and not help_[0].isupper(), described

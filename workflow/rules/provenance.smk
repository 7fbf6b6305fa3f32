# Each recipe's fragments joined into provenance/<recipe>/PROVENANCE.md, and `verify`, which re-hashes
# every file the fragments name. Rule file workflow/rules/provenance.smk; command
# `encoder-study provenance join|verify` (encoder_study.commands.provenance); library
# encoder_study.provenance.


rule provenance_join:
    input:
        fragments=lambda wc: RECIPES[wc.recipe],
        code=lib_code("provenance", "join"),
    output:
        recipe_target("{recipe}"),
    log:
        "logs/provenance/provenance_join-{recipe}.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study provenance join --recipe {wildcards.recipe} --out {output:q}"
        " {input.fragments:q} > {log:q} 2>&1"


# No inputs on purpose: verify checks what is on disk and never makes Snakemake rebuild anything first.
# The target users type is `verify`, so this rule keeps that name rather than provenance_verify.
rule verify:
    params:
        root="provenance",  # where prov() puts every fragment
        base=".",  # the recorded paths are relative to the working directory
    log:
        "logs/provenance/verify.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study provenance verify --root {params.root:q} --base {params.base:q} 2>&1 | tee {log:q}"


# The run's Workflow Run RO-Crate (Provenance Run Crate profile), built from those fragments' JSON
# twins. It sits at the top of the working directory, beside results/ and provenance/: RO-Crate wants
# the Snakefile inside the crate and no `../` in ids (encoder_study.crate says more). Its own fragment
# is not in it (that fragment hashes the crate).
rule provenance_crate:
    input:
        fragments=crate_fragments,
        workflow=os.path.relpath(workflow.main_snakefile),
        citation=os.path.relpath(Path(workflow.basedir) / "CITATION.cff"),
        license=os.path.relpath(Path(workflow.basedir) / "LICENSE"),
        code=lib_code("provenance", "crate"),
    output:
        crate="ro-crate-metadata.json",
        prov=prov("provenance", "provenance_crate"),
    params:
        base=".",  # the recorded paths are relative to the working directory: the crate's root
    log:
        "logs/provenance/provenance_crate.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study provenance crate --base {params.base:q} --workflow {input.workflow:q}"
        " --citation {input.citation:q} --license {input.license:q} --out {output.crate:q}"
        " --provenance {output.prov:q} {input.fragments:q} > {log:q} 2>&1"

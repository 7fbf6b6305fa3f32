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

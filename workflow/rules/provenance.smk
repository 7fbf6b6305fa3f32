# Each recipe's fragments joined into provenance/<recipe>/PROVENANCE.md, and `verify`, which
# re-hashes every file the fragments name. Library: encoder_study.provenance.


rule join_provenance:
    input:
        fragments=lambda wc: RECIPES[wc.recipe],
        code=lib_code("provenance"),
    output:
        "provenance/{recipe}/PROVENANCE.md",
    log:
        "logs/provenance/join-{recipe}.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study provenance join --recipe {wildcards.recipe} --out {output:q}"
        " {input.fragments:q} > {log:q} 2>&1"


# No inputs on purpose: verify checks what is on disk and never makes Snakemake rebuild anything first.
rule verify:
    log:
        "logs/provenance/verify.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study provenance verify --root provenance 2>&1 | tee {log:q}"

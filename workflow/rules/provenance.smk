# Each recipe's fragments joined into provenance/<recipe>/PROVENANCE.md, the run crate and its digest,
# and `verify`, which re-hashes every file the fragments and the crate name. Rule file
# workflow/rules/provenance.smk; command `encoder-study provenance join|verify|crate`
# (encoder_study.provenance.command); libraries encoder_study.provenance and encoder_study.provenance.crate.
import time



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
# twins, and the run's digest: the crate's SHA-256, which a paper cites and `encoder-study provenance
# verify --digest` checks. The crate sits at the top of the working directory, beside results/ and
# provenance/: RO-Crate wants the Snakefile inside the crate and no `../` in ids (encoder_study.provenance.crate
# says more). Its own fragment is not in it (that fragment hashes the crate).
rule provenance_crate:
    input:
        fragments=crate_fragments,
        documents=crate_documents,
        workflow=os.path.relpath(workflow.main_snakefile),
        citation=os.path.relpath(Path(workflow.basedir) / "CITATION.cff"),
        license=os.path.relpath(Path(workflow.basedir) / "LICENSE"),
        readme=os.path.relpath(Path(workflow.basedir) / "README.md"),
        sources=workflow_sources(),
        configfiles=sorted({os.path.relpath(p) for p in workflow.configfiles}),
        code=lib_code("provenance", "crate"),
    output:
        crate="ro-crate-metadata.json",
        digest="ro-crate-metadata.sha256",  # encoder_study.provenance.crate.DIGEST_NAME
        prov=prov("provenance", "provenance_crate"),
    params:
        # The recorded paths are relative to the working directory: the crate's root, where it lies.
        base=lambda wildcards, output: os.path.dirname(output.crate) or ".",
        agent=config["provenance"]["agent"],
    log:
        "logs/provenance/provenance_crate.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study provenance crate --base {params.base:q} --workflow {input.workflow:q}"
        " --citation {input.citation:q} --license {input.license:q} --readme {input.readme:q}"
        " --agent={params.agent:q} --out {output.crate:q} --digest-out {output.digest:q}"
        " --provenance {output.prov:q} {input.fragments:q} --code {input.sources:q}"
        " --documents {input.documents:q} --configfiles {input.configfiles:q} > {log:q} 2>&1"


# `all` ends with the run's digest: printed once the run succeeds, if this run wrote it.
RUN_STARTED = time.time()


onsuccess:
    digest = Path(rules.provenance_crate.output.digest)
    if digest.is_file() and digest.stat().st_mtime >= RUN_STARTED:
        print(f"Run digest (SHA-256 of {rules.provenance_crate.output.crate}; cite it with the commit): "
              f"{digest.read_text(encoding='utf-8').split()[0]}\nA reviewer checks the run against it: "
              "encoder-study provenance verify --root provenance --base . --digest <digest>")

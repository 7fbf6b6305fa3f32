# Recipe `tagging`: the treebank (synthetic or UD English-EWT), UPOS taggers on frozen and fine-tuned
# encoders, the most-frequent-tag baseline, spaCy runs (an external baseline), bootstrap intervals,
# comparisons and the step-time table.
# Rule file workflow/rules/tagging.smk; command `encoder-study tagging` (encoder_study.recipes.tagging.command);
# library encoder_study.recipes.tagging (runs, baseline, gather, splits, train, tagger, evaluate, pipeline, steptime,
# spacy) and encoder_study.data (conllu, synthetic).

if config["treebank"]["source"] == "synthetic":

    rule tagging_treebank:
        input:
            code=lib_code("tagging", "treebank"),
        output:
            train="results/treebank/train.conllu",
            dev="results/treebank/dev.conllu",
            test="results/treebank/test.conllu",
            prov=prov("tagging", "tagging_treebank"),
        params:
            out_dir=lambda wc, output: Path(output.train).parent,
            seed=config["treebank"]["seed"],
            sizes=config["treebank"]["sizes"],
        log:
            "logs/tagging/tagging_treebank.log",
        resources: **resources_of("tagging_treebank")
        conda:
            CONDA_ENV
        shell:
            "encoder-study tagging treebank --seed {params.seed} --train {params.sizes[train]}"
            " --dev {params.sizes[dev]} --test {params.sizes[test]} --out-dir {params.out_dir:q}"
            " --provenance {output.prov:q} > {log:q} 2>&1"

    TREEBANK = {split: getattr(rules.tagging_treebank.output, split) for split in TREEBANK_SPLITS}
    TREEBANK_FRAGMENTS = [rules.tagging_treebank.output.prov]

# Extra test sets (treebank.extra_tests): scored by every run, never trained on nor used for selection.
EXTRA_TESTS = config["treebank"]["extra_tests"]
EXTRA_SYNTHETIC = sorted(name for name, entry in EXTRA_TESTS.items() if entry.get("synthetic"))
# The downloads: the treebank's splits (source ewt) and the extra test sets given by URL or path.
FETCHED = (TREEBANK_SPLITS if config["treebank"]["source"] != "synthetic" else ()) + tuple(
    sorted(name for name in EXTRA_TESTS if name not in EXTRA_SYNTHETIC))
# name -> (URL, pinned SHA-256 or "") of each download.
FETCH_SOURCES = {name: (EXTRA_TESTS[name]["url"], EXTRA_TESTS[name]["sha256"]) if name in EXTRA_TESTS
                 else (config["treebank"][name], config["treebank"][f"{name}_sha256"]) for name in FETCHED}


if FETCHED:

    # A download: on the submitting host (see the Snakefile's localrules).
    localrules:
        tagging_fetch,

    rule tagging_fetch:
        input:
            code=lib_code("tagging", "fetch"),
        output:
            treebank="results/treebank/{split}.conllu",
            prov=prov("tagging", "tagging_fetch", "{split}"),
        wildcard_constraints:
            split="|".join(re.escape(name) for name in FETCHED),
        params:
            url=lambda wc: FETCH_SOURCES[wc.split][0],
            sha256=lambda wc: FETCH_SOURCES[wc.split][1],
            pin_key=lambda wc: f"treebank.extra_tests.{wc.split}.sha256" if wc.split in EXTRA_TESTS
            else f"treebank.{wc.split}_sha256",
            timeout=config["treebank"]["timeout"],
        log:
            "logs/tagging/tagging_fetch-{split}.log",
        conda:
            CONDA_ENV
        shell:
            "encoder-study tagging fetch --split {wildcards.split} --url {params.url:q}"
            " --sha256={params.sha256:q} --timeout {params.timeout} --out {output.treebank:q}"
            " --provenance {output.prov:q} > {log:q} 2>&1"
            # An unpinned download's pin to add (encoder_study.core.download.PIN): shown once, when it is made.
            "; grep '^pin: ' {log:q} | sed 's/^pin:/pin {params.pin_key}:/' >&2 || true"

if config["treebank"]["source"] != "synthetic":
    TREEBANK = {split: expand(rules.tagging_fetch.output.treebank, split=split)[0] for split in TREEBANK_SPLITS}
    TREEBANK_FRAGMENTS = expand(rules.tagging_fetch.output.prov, split=TREEBANK_SPLITS)

if EXTRA_SYNTHETIC:

    rule tagging_ood:
        input:
            code=lib_code("tagging", "ood"),
        output:
            treebank="results/treebank/{extra}.conllu",
            prov=prov("tagging", "tagging_ood", "{extra}"),
        wildcard_constraints:
            extra="|".join(re.escape(name) for name in EXTRA_SYNTHETIC),
        params:
            seed=config["treebank"]["seed"],
            sentences=lambda wc: EXTRA_TESTS[wc.extra]["sentences"],
        log:
            "logs/tagging/tagging_ood-{extra}.log",
        resources: **resources_of("tagging_ood")
        conda:
            CONDA_ENV
        shell:
            "encoder-study tagging ood --name {wildcards.extra} --seed {params.seed}"
            " --sentences {params.sentences} --out {output.treebank:q} --provenance {output.prov:q} > {log:q} 2>&1"

# name -> gold file, sorted by name: the order of the rows each run adds to its scores.csv.
EXTRA = {
    name: expand(rules.tagging_ood.output.treebank if name in EXTRA_SYNTHETIC else rules.tagging_fetch.output.treebank,
                 **({"extra": name} if name in EXTRA_SYNTHETIC else {"split": name}))[0]
    for name in sorted(EXTRA_TESTS)
}
TREEBANK_FRAGMENTS = TREEBANK_FRAGMENTS + [
    expand(rules.tagging_ood.output.prov if name in EXTRA_SYNTHETIC else rules.tagging_fetch.output.prov,
           **({"extra": name} if name in EXTRA_SYNTHETIC else {"split": name}))[0]
    for name in sorted(EXTRA_TESTS)
]
EXTRA_OPTIONS = " ".join(f"--extra {shlex.quote(f'{name}={path}')}" for name, path in EXTRA.items())
GOLD_OPTIONS = " ".join(f"--gold {shlex.quote(f'{split}={path}')}"
                        for split, path in [("dev", TREEBANK["dev"]), ("test", TREEBANK["test"]), *EXTRA.items()])


rule tagging_train:
    input:
        unpack(lambda wc: {**TREEBANK, "model": model_files(RUNS[wc.run]["model"])}),
        extra=list(EXTRA.values()),
        code=lib_code("tagging", "train"),
    output:
        pipeline="results/tagging/{run}/pipeline.safetensors",
        dev="results/tagging/{run}/dev.pred.conllu",
        test="results/tagging/{run}/test.pred.conllu",
        extra=[f"results/tagging/{{run}}/{name}.pred.conllu" for name in EXTRA],
        scores=result("tagging_run_scores"),
        history=result("tagging_run_history"),
        record="results/tagging/{run}/run.json",
        prov=prov("tagging", "tagging_train", "{run}"),
    params:
        model_dir=lambda wc, input: Path(input.model[0]).parent,
        out_dir=lambda wc, output: Path(output.scores).parent,
        options=lambda wc: run_options(RUNS[wc.run]),
        extra=EXTRA_OPTIONS,
        # Outside the run's directory, whose outputs Snakemake deletes when a job fails: a retry (or a
        # rerun) resumes from it. The command removes it once the run is done, so a later rerun (new
        # code, new data) starts afresh.
        checkpoint=lambda wc: f"results/tagging/checkpoints/{wc.run}.pt",
        journal=lambda wc: f"results/tagging/checkpoints/{wc.run}.log",  # common.smk, keeping_attempts
        seed=config["tagging"]["seed"],
        bootstrap=BOOTSTRAP,
        # `auto` (the default) resolves in the job, so the host's GPU is not a rerun trigger.
        device=config["tagging"]["device"],
    threads: threads_for("tagging_train")
    priority: TRAIN_PRIORITY
    # A crash resumes from the last checkpoint (saved every chunk_steps steps) on the next attempt.
    retries: config["tagging"]["retries"]
    log:
        "logs/tagging/tagging_train-{run}.log",
    benchmark:
        "results/benchmarks/tagging_train/{run}.tsv"
    resources: **resources_of("tagging_train")
    conda:
        CONDA_ENV
    shell:
        keeping_attempts(
            "encoder-study tagging train --run {wildcards.run:q} --model-dir {params.model_dir:q}"
            " --train {input.train:q} --dev {input.dev:q} --test {input.test:q} {params.extra}"
            " --out-dir {params.out_dir:q} --checkpoint {params.checkpoint:q}"
            " {params.options} --seed {params.seed} {params.bootstrap} --threads {threads}"
            " --device {params.device} --provenance {output.prov:q}")


rule tagging_baseline:
    input:
        **TREEBANK,
        extra=list(EXTRA.values()),
        code=lib_code("tagging", "baseline"),
    output:
        dev="results/tagging/baseline/dev.pred.conllu",
        test="results/tagging/baseline/test.pred.conllu",
        extra=[f"results/tagging/baseline/{name}.pred.conllu" for name in EXTRA],
        scores=result("tagging_baseline_scores"),
        prov=prov("tagging", "tagging_baseline"),
    params:
        out_dir=lambda wc, output: Path(output.scores).parent,
        extra=EXTRA_OPTIONS,
        bootstrap=BOOTSTRAP,
    log:
        "logs/tagging/tagging_baseline.log",
    resources: **resources_of("tagging_baseline")
    conda:
        CONDA_ENV
    shell:
        "encoder-study tagging baseline --run baseline --task upos --train {input.train:q} --dev {input.dev:q}"
        " --test {input.test:q} {params.extra} --out-dir {params.out_dir:q} {params.bootstrap}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


# spaCy runs (mode spacy): an external baseline, a spaCy pipeline tagging the treebank's words. Source
# `train`: trained from its spaCy config on train; `package`: a published pipeline's wheel, downloaded.
SPACY_NAMES = sorted(SPACY_RUNS)
SPACY_PACKAGES = [name for name in SPACY_NAMES if SPACY_RUNS[name]["source"] == "package"]

if SPACY_PACKAGES:

    # A download: on the submitting host (see the Snakefile's localrules).
    localrules:
        tagging_spacy_fetch,

    rule tagging_spacy_fetch:
        input:
            code=lib_code("tagging", "spacy-fetch"),
        output:
            wheel="results/tagging/spacy-packages/{run}.whl",
            prov=prov("tagging", "tagging_spacy_fetch", "{run}"),
        wildcard_constraints:
            run="|".join(re.escape(name) for name in SPACY_PACKAGES),
        params:
            url=lambda wc: SPACY_RUNS[wc.run]["url"],
            sha256=lambda wc: SPACY_RUNS[wc.run]["sha256"],
            pin_key=lambda wc: f"tagging.runs[{wc.run}].sha256",
            timeout=config["tagging"]["spacy"]["timeout"],
        log:
            "logs/tagging/tagging_spacy_fetch-{run}.log",
        conda:
            CONDA_ENV
        shell:
            "encoder-study tagging spacy-fetch --url {params.url:q} --sha256={params.sha256:q}"
            " --timeout {params.timeout} --out {output.wheel:q} --provenance {output.prov:q} > {log:q} 2>&1"
            "; grep '^pin: ' {log:q} | sed 's/^pin:/pin {params.pin_key}:/' >&2 || true"


if SPACY_NAMES:

    rule tagging_spacy:
        input:
            unpack(spacy_inputs),
            dev=TREEBANK["dev"],
            test=TREEBANK["test"],
            extra=list(EXTRA.values()),
            code=lib_code("tagging", "spacy"),
        output:
            dev="results/tagging/{run}/dev.pred.conllu",
            test="results/tagging/{run}/test.pred.conllu",
            extra=[f"results/tagging/{{run}}/{name}.pred.conllu" for name in EXTRA],
            scores=result("tagging_spacy_scores"),
            record="results/tagging/{run}/run.json",
            pipeline=directory("results/tagging/{run}/spacy"),
            prov=prov("tagging", "tagging_spacy", "{run}"),
        wildcard_constraints:
            run="|".join(re.escape(name) for name in SPACY_NAMES),
        params:
            options=spacy_options,
            out_dir=lambda wc, output: Path(output.scores).parent,
            extra=EXTRA_OPTIONS,
            batch_size=config["tagging"]["spacy"]["batch_size"],
            bootstrap=BOOTSTRAP,
        log:
            "logs/tagging/tagging_spacy-{run}.log",
        benchmark:
            "results/benchmarks/tagging_spacy/{run}.tsv"
        resources: **resources_of("tagging_spacy")
        conda:
            CONDA_ENV
        shell:
            "encoder-study tagging spacy --run {wildcards.run:q} {params.options} --dev {input.dev:q}"
            " --test {input.test:q} {params.extra} --out-dir {params.out_dir:q} --batch-size {params.batch_size}"
            " {params.bootstrap} --provenance {output.prov:q}"
            " > {log:q} 2>&1"

    SPACY_OUTPUTS = {key: expand(getattr(rules.tagging_spacy.output, key), run=SPACY_NAMES)
                     for key in ("dev", "test", "extra", "scores", "prov")}
else:
    SPACY_OUTPUTS = {key: [] for key in ("dev", "test", "extra", "scores", "prov")}


rule tagging_tables:
    input:
        runs=expand(rules.tagging_train.output.scores, run=[r for r in RUN_NAMES if RUNS[r]["task"] == "upos"])
        + [rules.tagging_baseline.output.scores] + SPACY_OUTPUTS["scores"],
        dev=TREEBANK["dev"],
        test=TREEBANK["test"],
        extra=list(EXTRA.values()),
        code=lib_code("tagging", "tables"),
    output:
        scores=result("tagging_scores"),
        # Written beside the CSVs by the command; declared for the report's HTML renderings.
        scores_md="results/tagging/scores.md",
        comparisons_md="results/tagging/comparisons.md",
        comparisons=result("tagging_comparisons"),
        plot=result("tagging_dev_upos"),
        scores_plot=result("tagging_scores_plot"),
        comparisons_plot=result("tagging_comparisons_plot"),
        prov=prov("tagging", "tagging_tables"),
    params:
        run_dirs=lambda wc, input: " ".join(f"--run-dir {shlex.quote(str(Path(f).parent))}" for f in input.runs),
        compare=" ".join(f"--compare {a}:{b}" for a, b in task_comparisons("upos")),
        # Dashed lines beside the baseline's on the development plot: the spaCy runs' dev scores.
        references=" ".join(f"--reference {name}" for name in SPACY_NAMES),
        # Every gold split: the comparisons are made on dev, test and each extra test set.
        gold=GOLD_OPTIONS,
        caption=TREEBANK_CAPTION,
        bootstrap=BOOTSTRAP,
    log:
        "logs/tagging/tagging_tables.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study tagging tables --task upos {params.run_dirs} {params.gold}"
        " {params.compare} --reference baseline {params.references} --scores-out {output.scores:q}"
        " --comparisons-out {output.comparisons:q} --plot {output.plot:q} --scores-plot {output.scores_plot:q}"
        " --comparisons-plot {output.comparisons_plot:q} {params.bootstrap}"
        " --caption {params.caption:q} --provenance {output.prov:q} > {log:q} 2>&1"


# The scores and comparisons of another task's runs (an xpos run's: data.tasks), as tagging_tables joins
# the upos runs': the same bootstrap, no baseline (the baseline is upos), no plots.
rule tagging_task_tables:
    input:
        runs=lambda wc: expand(rules.tagging_train.output.scores, run=TASK_RUNS[wc.task]),
        dev=TREEBANK["dev"],
        test=TREEBANK["test"],
        extra=list(EXTRA.values()),
        code=lib_code("tagging", "tables"),
    output:
        scores=result("tagging_task_scores"),
        scores_md="results/tagging/{task}/scores.md",
        comparisons=result("tagging_task_comparisons"),
        comparisons_md="results/tagging/{task}/comparisons.md",
        prov=prov("tagging", "tagging_task_tables", "{task}"),
    wildcard_constraints:
        task="|".join(OTHER_TASKS),
    params:
        run_dirs=lambda wc, input: " ".join(f"--run-dir {shlex.quote(str(Path(f).parent))}" for f in input.runs),
        compare=lambda wc: " ".join(f"--compare {a}:{b}" for a, b in task_comparisons(wc.task)),
        gold=GOLD_OPTIONS,
        caption=TREEBANK_CAPTION,
        bootstrap=BOOTSTRAP,
    log:
        "logs/tagging/tagging_task_tables-{task}.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study tagging tables --task {wildcards.task} {params.run_dirs} {params.gold} {params.compare}"
        " --scores-out {output.scores:q} --comparisons-out {output.comparisons:q} {params.bootstrap}"
        " --caption {params.caption:q} --provenance {output.prov:q} > {log:q} 2>&1"


# Per-tag accuracy of the best frozen and the best fine-tuned run (highest development UPOS, ties to the
# run name that sorts first), on the test split. Every trained run's test predictions are inputs: which
# runs are best is known only once they are scored.
rule tagging_per_tag:
    input:
        scores=rules.tagging_tables.output.scores,
        preds=expand(rules.tagging_train.output.test, run=RUN_NAMES),
        gold=TREEBANK["test"],
        code=lib_code("tagging", "per-tag"),
    output:
        table=result("tagging_per_tag"),
        # Written beside the CSV by the command; declared for the report's HTML rendering.
        markdown="results/tagging/per_tag.md",
        plot=result("tagging_per_tag_plot"),
        prov=prov("tagging", "tagging_per_tag"),
    params:
        run_dirs=lambda wc, input: " ".join(f"--run-dir {shlex.quote(str(Path(f).parent))}" for f in input.preds),
        caption=TREEBANK_CAPTION,
    log:
        "logs/tagging/tagging_per_tag.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study tagging per-tag {params.run_dirs} --scores {input.scores:q} --split test"
        " --gold {input.gold:q} --out {output.table:q} --plot {output.plot:q} --caption {params.caption:q}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


rule tagging_step_time:
    input:
        models=[model_files(m) for m in config["tagging"]["step_time"]["models"]],
        code=lib_code("tagging", "step-time"),
    output:
        markdown="results/tagging/step_time.md",
        table=result("tagging_step_time"),
        prov=prov("tagging", "tagging_step_time"),
    params:
        models=" ".join(model_option(m) for m in config["tagging"]["step_time"]["models"]),
        batch=config["tagging"]["step_time"]["batch"],
        length=config["tagging"]["step_time"]["length"],
        warmup=config["tagging"]["step_time"]["warmup"],
        steps=config["tagging"]["step_time"]["steps"],
        min_seconds=config["timing"]["min_seconds"],
        lr=config["tagging"]["step_time"]["lr"],
        seed=config["tagging"]["seed"],
        device=config["tagging"]["device"],
        threads=threads_for("tagging_step_time"),
    # Timed: locally every slot the workflow has, so that no other job runs beside it; on a cluster
    # the config's threads and a node of its own (common.smk, timed_threads).
    threads: timed_threads("tagging_step_time", "threads.default")
    log:
        "logs/tagging/tagging_step_time.log",
    benchmark:
        "results/benchmarks/tagging_step_time.tsv"
    resources: **resources_of("tagging_step_time")
    conda:
        CONDA_ENV
    shell:
        "encoder-study tagging step-time {params.models} --out {output.table:q} --batch {params.batch}"
        " --length {params.length} --warmup {params.warmup} --steps {params.steps} --lr {params.lr}"
        " --min-seconds {params.min_seconds}"
        " --seed {params.seed} --threads {params.threads} --device {params.device}"
        " --provenance {output.prov:q} > {log:q} 2>&1"


register("tagging", TREEBANK_FRAGMENTS + [rules.tagging_baseline.output.prov]
         + (expand(rules.tagging_spacy_fetch.output.prov, run=SPACY_PACKAGES) if SPACY_PACKAGES else [])
         + SPACY_OUTPUTS["prov"] + expand(rules.tagging_train.output.prov, run=RUN_NAMES)
         + [rules.tagging_tables.output.prov]
         + expand(rules.tagging_task_tables.output.prov, task=OTHER_TASKS)
         + [rules.tagging_per_tag.output.prov, rules.tagging_step_time.output.prov])


rule tagging:
    input:
        rules.tagging_tables.output.scores,
        rules.tagging_tables.output.comparisons,
        expand(rules.tagging_task_tables.output.comparisons, task=OTHER_TASKS),
        rules.tagging_per_tag.output.table,
        rules.tagging_step_time.output.table,
        expand(rules.tagging_train.output.dev, run=RUN_NAMES),
        expand(rules.tagging_train.output.test, run=RUN_NAMES),
        rules.tagging_baseline.output.extra,
        expand(rules.tagging_train.output.extra, run=RUN_NAMES),
        SPACY_OUTPUTS["dev"] + SPACY_OUTPUTS["test"] + SPACY_OUTPUTS["extra"],
        recipe_target("tagging"),

# What `snakemake --report report.zip` shows beside the tables and plots the recipes mark for it:
# - HTML renderings of the study's tables (its viewer offers a CSV only as a download): each page renders
#   the table's formatted Markdown (the same digits as the .md), each interval joined to its value;
# - the run's facts that the captions cite (workflow/report/*.rst include results/report/settings.rst) and
#   a page of every job's recorded settings, both from the fragments' JSON twins: the captions say what
#   ran, whatever config the report is built with;
# - the landing page (the workflow's description, workflow/report/workflow.rst, includes
#   results/report/landing.rst): the study in three sentences, the headline tables, the run's digest,
#   commit and config files.
# Command: `encoder-study report table|settings|landing` (encoder_study.report.command). Libraries:
# encoder_study.report.html, report_facts, report_landing. Presentation only: no provenance fragment (the
# fragments they read hold the numbers' provenance).


report: "../report/workflow.rst"


# The tables with an HTML page (encoder_study.core.results: those with a title); the write-back's only
# where runs are written back.
REPORT_TABLES = {name: entry for name, entry in RESULTS.items()
                 if entry.title and (WRITEBACK_RUNS or not name.startswith("writeback_"))}

for _name, _entry in sorted(REPORT_TABLES.items()):

    rule:
        name:
            f"report_{_name}"
        input:
            markdown=_entry.markdown,
            code=lib_code("report", "table"),
        output:
            html=report(_entry.html, caption=caption(_entry.caption, _entry.category), category=_entry.category,
                        subcategory=_entry.subcategory),
        params:
            title=f"{_entry.title} (HTML rendering of {_entry.markdown})",
        localrule: True
        log:
            f"logs/report/report_{_name}.log",
        conda:
            CONDA_ENV
        shell:
            "encoder-study report table {input.markdown:q} --title {params.title:q} --out {output.html:q}"
            " > {log:q} 2>&1"


# The facts the captions cite, from every fragment `all` makes; the page lists each job's settings.
REPORT_SETTINGS = "results/report/run_settings.html"


rule report_settings:
    input:
        fragments=crate_fragments,
        code=lib_code("report", "settings"),
    output:
        rst="results/report/settings.rst",
        html=report(REPORT_SETTINGS, caption=caption("run_settings.rst", "run"), category="run"),
    localrule: True
    log:
        "logs/report/report_settings.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study report settings {input.fragments:q} --rst {output.rst:q} --html {output.html:q}"
        " > {log:q} 2>&1"


REPORT_PAGES = [entry.html for entry in REPORT_TABLES.values()]
REPORT_PAGES.append(REPORT_SETTINGS)

# The landing page's headline tables (encoder_study.core.results.LANDING): role -> formatted Markdown.
LANDING_TABLES = {role: REPORT_TABLES[name].markdown for role, name in LANDING.items()}


# The config files this invocation read, in the order they apply (the Snakefile's, then each --configfile),
# relative to the working directory where they lie under it.
_GIVEN = [Path(f).absolute() for f in workflow.config_settings.configfiles]
RUN_CONFIGFILES = [
    os.path.relpath(f) if Path(f).absolute().is_relative_to(Path.cwd()) else str(f)
    for f in [Path(f) for f in workflow.configfiles if Path(f).absolute() not in _GIVEN] + _GIVEN
]


rule report_landing:
    input:
        fragments=crate_fragments,
        tables=list(LANDING_TABLES.values()),
        # The run's digest, which the crate step writes beside the crate: this page comes after the
        # crate, so the crate cannot hold it.
        digest=rules.provenance_crate.output.digest,
        configfiles=RUN_CONFIGFILES,
        code=lib_code("report", "landing"),
    output:
        "results/report/landing.rst",
    params:
        tables=" ".join(f"--table {shlex.quote(f'{role}={path}')}" for role, path in LANDING_TABLES.items()),
        configfiles=" ".join(f"--configfile {shlex.quote(f)}" for f in RUN_CONFIGFILES),
        overrides=json.dumps(dict(workflow.config_settings.config), sort_keys=True, default=str),
    localrule: True
    log:
        "logs/report/report_landing.log",
    conda:
        CONDA_ENV
    shell:
        "encoder-study report landing {input.fragments:q} {params.tables} --digest {input.digest:q}"
        " {params.configfiles} --overrides {params.overrides:q} --out {output:q} > {log:q} 2>&1"


REPORT_LANDING = rules.report_landing.output[0]

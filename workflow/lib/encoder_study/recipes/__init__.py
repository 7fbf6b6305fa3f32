"""One package per recipe, each with its `command.py` (argparse and wiring: `encoder-study <recipe>`)
beside the stages it runs; rule file `workflow/rules/<recipe>.smk`. A recipe imports another only where
the data flows that way (docs/layout.md)."""

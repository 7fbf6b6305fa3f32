"""`encoder-study provenance join|verify|explain|crate|sign`: a recipe's PROVENANCE.md, re-hashing every
file the fragments' JSON twins and the run crate name, the chain of jobs behind a file or one row of a
table, the run's Workflow Run RO-Crate and its digest, and an SSH signature of the crate (library:
encoder_study.provenance.crate).

    encoder-study provenance join --recipe student --out provenance/student/PROVENANCE.md FRAGMENT...
    encoder-study provenance verify --root provenance --base . [--digest HEX] [--env] [--fast] \\
        [--signature ro-crate-metadata.json.sig --allowed-signers FILE [--identity ID]]
    encoder-study provenance sign --key ~/.ssh/id_ed25519 [--crate ro-crate-metadata.json]
    encoder-study provenance explain results/tagging/scores.csv --row minilm-finetuned,test
    encoder-study provenance crate --base . --workflow Snakefile --citation CITATION.cff \\
        --license LICENSE --readme README.md --out ro-crate-metadata.json --provenance FRAGMENT \\
        FRAGMENT... [--agent 'Name <email>'] [--code FILE...] [--documents FILE...] [--configfiles FILE...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import provenance
from .verify import FAST_CACHE


def join(args) -> int:
    from .join import join as join_fragments

    join_fragments(args.recipe, args.fragments, args.out)
    return 0


def verify(args) -> int:
    """Status 1 and one line per difference on stderr when a file changed or is missing."""
    from . import crate as run_crate
    from . import verify as checks
    from .records import fragments_under

    cache = checks.HashCache(Path(args.base) / checks.FAST_CACHE) if args.fast else None
    hasher = run_crate.OnceHasher(cache)  # the crate lists the fragments' files again: read them once
    problems = checks.verify(args.root, args.base, env=args.env, cache=hasher)
    crate_path = Path(args.crate) if args.crate else Path(args.base) / run_crate.CRATE_NAME
    crate_note = crate_problems(args, crate_path, hasher, problems)
    from . import lineage

    try:
        problems += lineage.table_problems(args.root, args.base)
    except provenance.ProvenanceError:
        pass  # a twin that cannot be read: verify has named it
    if cache is not None:
        cache.save()
    if problems:
        print(f"verify: {len(problems)} difference(s):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"verify: every file named by {len(fragments_under(args.root))} fragment(s) under "
          f"{args.root} matches its SHA-256"
          + ("; the recorded library and Python versions are the installed ones" if args.env else "")
          + (f"; --fast: {cache.hits} file(s) not read again (size, times and inode as when hashed), "
             f"{cache.hashed} hashed" if cache is not None else "") + f"; {crate_note}")
    return 0


def crate_problems(args, crate_path: Path, hasher, problems: list[str]) -> str:
    """Check the run crate (against `--digest` first, when given), adding its differences to
    `problems`; what the check covered, for the closing line."""
    from . import crate as run_crate

    if args.digest:
        problems += run_crate.check_digest(crate_path, args.digest)
    signed = ""
    if args.signature and not args.allowed_signers:
        raise run_crate.CrateError("--signature needs --allowed-signers: the file naming whose keys you "
                                   "accept (ssh-keygen's allowed signers format)")
    if args.signature and not crate_path.is_file():
        problems.append(f"{crate_path} is missing: {args.signature} signs a run crate")
    elif args.signature:
        found, who = run_crate.check_signature(crate_path, args.signature, args.allowed_signers,
                                               args.identity)
        problems += found
        signed = "" if found else f"signed by {who}; "
    if not crate_path.is_file():
        return (f"no run crate ({crate_path}): the joined PROVENANCE.md files, the report's pages and the "
                "workflow's code are checked against the crate `all` writes")
    listed = run_crate.check(crate_path, args.base, hasher.sha256)
    problems += listed
    count = len(run_crate.files_of(run_crate.read(crate_path)))
    anchor = f"the crate is the one digest {args.digest.strip().lower()} names, and " if args.digest else ""
    return f"{signed}{anchor}the {count} file(s) the run crate {crate_path} lists match it"


def sign(args) -> int:
    from . import crate as run_crate

    target = args.out or f"{args.crate}.sig"
    run_crate.sign(args.crate, args.key, target)
    digest, _ = run_crate.digest_line(args.crate)
    print(f"sign: {target} signs {args.crate} (run digest {digest}) with {args.key}; a reviewer checks it "
          f"with: encoder-study provenance verify --root provenance --base . --signature {target} "
          "--allowed-signers <file naming your public key>")
    return 0


def explain(args) -> int:
    """The chain on stdout; status 1, and each changed file and failed row check on stderr, if any."""
    from . import lineage

    row = args.row.split(",") if args.row is not None else None
    explained = lineage.explain(args.root, args.file, row, args.base)
    print(explained.text, end="")
    if explained.problems:
        print(f"explain: {len(explained.problems)} problem(s):", file=sys.stderr)
        for line in explained.problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


def crate(args) -> int:
    from ..core import files
    from . import crate as run_crate

    sources = run_crate.Sources(
        workflow=Path(args.workflow), citation=Path(args.citation), license=Path(args.license),
        readme=Path(args.readme), code=[Path(p) for p in args.code],
        documents=[Path(p) for p in args.documents], configfiles=[Path(p) for p in args.configfiles])
    skip = ("fragments", "code", "documents", "configfiles")
    with provenance.Fragment(args.provenance, provenance.settings(args, skip)) as frag:
        records = run_crate.read_fragments(args.fragments)
        frag.inputs += [twin for twin, _ in records] + [args.workflow, args.citation, args.license,
                                                         args.readme, *args.code, *args.documents,
                                                         *args.configfiles]
        built = run_crate.build(records, args.base, sources, args.agent)
        files.write_text(args.out, run_crate.text(built))
        digest, line = run_crate.digest_line(args.out)
        digest_out = args.digest_out or str(Path(args.out).with_name(run_crate.DIGEST_NAME))
        files.write_text(digest_out, line)
        frag.outputs += [args.out, digest_out]
        frag.note(f"{len(records)} jobs and {len(run_crate.files_of(built))} files described; "
                  f"the run's digest (the crate's SHA-256) is {digest}")
    print(f"crate: {args.out} describes {len(records)} jobs")
    print(f"run digest: {digest} (SHA-256 of {args.out}, also in {digest_out}; cite it with the commit, "
          f"{provenance.describe_code(provenance.code_state(args.base))})")
    return 0


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="encoder-study provenance",
                                     description="join, verify or explain fragments")
    sub = result.add_subparsers(required=True)
    p = sub.add_parser("join", help="join a recipe's fragments into its PROVENANCE.md")
    p.set_defaults(run=join)
    p.add_argument("--recipe", required=True)
    p.add_argument("--out", required=True, help="provenance/<recipe>/PROVENANCE.md")
    p.add_argument("fragments", nargs="+")
    p = sub.add_parser("verify", help="re-hash every file the fragments name; status 1 on any difference")
    p.set_defaults(run=verify)
    p.add_argument("--root", required=True, help="the fragments' folder: provenance")
    p.add_argument("--base", required=True, help="the folder the recorded paths are relative to: .")
    p.add_argument("--env", action="store_true",
                   help="also compare the recorded library and Python versions with the installed ones")
    p.add_argument("--digest", help="the run's digest as a paper cites it: the run crate's SHA-256 must be "
                                     "this before its files are checked against it")
    p.add_argument("--crate", help="the run crate (default: ro-crate-metadata.json under --base); when it "
                                   "exists, every file it lists is checked too")
    p.add_argument("--signature", help="an SSH signature of the run crate (`provenance sign`): checked "
                                        "with ssh-keygen against --allowed-signers")
    p.add_argument("--allowed-signers", help="whose keys you accept: ssh-keygen's allowed signers file "
                                             "('<identity> <key type> <public key>' per line)")
    p.add_argument("--identity", help="the signer --signature must be (default: whoever "
                                      "--allowed-signers lists for its key)")
    p.add_argument("--fast", action="store_true",
                   help=f"do not read again a file whose size, mtime, ctime and inode are as when it was "
                        f"hashed (kept in <base>/{FAST_CACHE}); without it every file is read")
    p = sub.add_parser("explain", help="the jobs, commands, code and inputs (with SHA-256) behind a file")
    p.set_defaults(run=explain)
    p.add_argument("file", help="a file the workflow wrote, e.g. results/tagging/scores.csv")
    p.add_argument("--row", help="one row of a CSV table: values of its cells in column order, "
                                 "comma-separated, e.g. minilm-finetuned,test")
    p.add_argument("--root", default="provenance", help="the fragments' folder")
    p.add_argument("--base", default=".", help="the folder the recorded paths are relative to")
    p = sub.add_parser("sign", help="sign the run crate with an SSH key: who vouches for the run")
    p.set_defaults(run=sign)
    p.add_argument("--key", required=True, help="the SSH private key (e.g. ~/.ssh/id_ed25519)")
    p.add_argument("--crate", default="ro-crate-metadata.json", help="the run crate")
    p.add_argument("--out", help="the signature (default: <crate>.sig)")
    p = sub.add_parser("crate", help="the run's Workflow Run RO-Crate (Provenance Run Crate profile)")
    p.set_defaults(run=crate)
    p.add_argument("--base", required=True,
                   help="the crate's root: the folder the recorded paths are relative to (.)")
    p.add_argument("--workflow", required=True, help="the Snakefile, inside --base")
    p.add_argument("--citation", required=True, help="CITATION.cff: the title, authors and licence")
    p.add_argument("--license", required=True, help="the licence's text: LICENSE")
    p.add_argument("--readme", required=True, help="README.md, inside --base (described as about the crate)")
    p.add_argument("--agent", help="who runs the workflow: 'Name', 'Name <email>', optionally with an "
                                   "ORCID URL; default: git's author identity, else recorded as unknown")
    p.add_argument("--code", nargs="*", default=[], help="the workflow's code and config files, hashed now")
    p.add_argument("--documents", nargs="*", default=[],
                   help="the joined PROVENANCE.md files and the report's pages, hashed now")
    p.add_argument("--configfiles", nargs="*", default=[], help="the config files the run was given")
    p.add_argument("--digest-out", help="where the run's digest goes (default: ro-crate-metadata.sha256 "
                                        "beside --out)")
    p.add_argument("--out", required=True, help="the crate: <base>/ro-crate-metadata.json (its ids are "
                                                "relative to --base, so elsewhere it is only a copy)")
    provenance.add_arguments(p)
    p.add_argument("fragments", nargs="+", help="every fragment of the run (Markdown or JSON twin)")
    return result

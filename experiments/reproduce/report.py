"""``REPORT.md`` from the claim files: every claim's rows, its setting and figures, and what is not tested."""

import os

from .claims import CLAIMS, NOT_TESTED, PAPERS
from .record import DIFFERS, IN_KIND, REPRODUCED, read_claim

__all__ = ["claim_file", "write_report"]


def claim_file(out_dir, name):
    """Where claim ``name``'s HDF5 file lives under ``out_dir``."""
    return os.path.join(out_dir, "reproduce", f"{name}.h5")


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _anchor(title):
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


def _claim_section(claim, record):
    folder = f"reproduce/{claim.name}"
    lines = [
        f"### {claim.title}",
        "",
        f"`--only {claim.name}`; measured {record['finished']} in {record['seconds'] / 60:.1f} min"
        f"{' (--full)' if record['full'] else ''}.  {record['setting']}",
        "",
        "| claim | paper | ours | verdict | why |",
        "|---|---:|---:|---|---|",
    ]
    for row in record["rows"]:
        lines.append(
            f"| {_cell(row.claim)} | {_cell(row.paper)} | {_cell(row.shown)} | {row.verdict} | {_cell(row.why)} |"
        )
    lines.append("")
    for figure in record["figures"]:
        lines += [f"![{claim.title}]({folder}/{figure})", ""]
    if record["sources"]:
        shown = ", ".join(f"[`{s}`]({folder}/{s})" for s in record["sources"][:12])
        more = f" and {len(record['sources']) - 12} more in `{folder}/`" if len(record["sources"]) > 12 else ""
        lines += [f"Files: {shown}{more}.", ""]
    return lines


def write_report(out_dir):
    """Write ``out_dir/REPORT.md`` from the claim files found under
    ``out_dir/reproduce/`` (claims not measured yet are listed as such);
    returns its path."""
    records = {
        c.name: read_claim(claim_file(out_dir, c.name)) for c in CLAIMS if os.path.exists(claim_file(out_dir, c.name))
    }
    counts = {
        v: sum(r.verdict == v for rec in records.values() for r in rec["rows"]) for v in (REPRODUCED, IN_KIND, DIFFERS)
    }
    lines = [
        "# Reproducing the papers",
        "",
        "Every claim of the five source papers that one workstation can test, measured by "
        "`python -m experiments.reproduce` (`make reproduce`) and set beside the paper's figure.  Each "
        "claim's rows are read from its HDF5 file in `reproduce/`, next to the run and benchmark files they "
        "were computed from; a ratio is always measured in one run of this command.  Verdicts: "
        f"**{REPRODUCED}** (within 10 % of the paper's figure, or the same exact result), **{IN_KIND}** "
        "(the paper's direction or ordering holds at our scale, which cannot give its magnitude; the row "
        f"says why), **{DIFFERS}** (with the reason).  How to read and rerun it: "
        "[docs/reproduce.md](../docs/reproduce.md).",
        "",
        f"Rows: {counts[REPRODUCED]} {REPRODUCED}, {counts[IN_KIND]} {IN_KIND}, {counts[DIFFERS]} {DIFFERS}; "
        f"{len(records)} of {len(CLAIMS)} claims measured"
        + (f" on {next(iter(records.values()))['cores']} cores." if records else "."),
        "",
        "| paper | claim | rows | reproduced | in kind | differs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for claim in CLAIMS:
        record = records.get(claim.name)
        if record is None:
            lines.append(f"| {claim.paper} | {claim.title} (`{claim.name}`) | not measured | | | |")
            continue
        verdicts = [r.verdict for r in record["rows"]]
        lines.append(
            f"| {claim.paper} | [{claim.title}](#{_anchor(claim.title)}) | {len(verdicts)} | "
            f"{verdicts.count(REPRODUCED)} | {verdicts.count(IN_KIND)} | {verdicts.count(DIFFERS)} |"
        )
    lines.append("")
    for key, paper in PAPERS.items():
        mine = [c for c in CLAIMS if c.paper == key and c.name in records]
        if mine:
            lines += [f"## {paper}", ""]
            for claim in mine:
                lines += _claim_section(claim, records[claim.name])
    lines += ["## Not tested here", "", "| paper | claim | why not |", "|---|---|---|"]
    lines += [f"| {PAPERS[key]} | {_cell(what)} | {_cell(why)} |" for key, what, why in NOT_TESTED]
    path = os.path.join(out_dir, "REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path

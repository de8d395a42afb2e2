# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The platform submission bundle of a release, built from what the fleet's hosts kept of it.

Controller side (Python 3.11, standard library, Jinja2 and the collection's own code). The input
is one export per named host, as biv100.serving.serving_release returns it with `state:
exported`: the release's status and record on that host, the bytes the release installed there
(`contents`, base64) and the vendor's digest of every file involved (`vendor`). From them:

- build(release, hosts, reference=, force=): decides what the bundle holds and refuses what it
  cannot stand behind (a host without the release, a release not proven good, a record without
  its run document, two hosts of the same base that installed different bytes, a file the
  vendor has that a release would remove), each refusal naming the host and the path;
- the bundle's files: computility-run.yaml (the run document the deploy recorded, verbatim),
  patch_ops.sh (plugin_utils/_patch_ops.py), MANIFEST, files/<variant>/<path>, README.md
  (files/submission/README.md.j2) and SHA256SUMS (README.md, "The platform's submission
  bundle", describes them);
- archive(bundle): the folder as a reproducible .tar.gz.

A variant is one vendor base: the hosts whose vendor files have the same digests at every path
any host's release touched. Its id is the first 12 hex digits of the sha256 of its sorted
"path\\tbase\\n" lines, so it depends on the vendor files alone, never on the hosts' order.

Nothing here reads a clock or the machine: the same exports give the same bytes, so a rebuild
of an unchanged release changes no file and the archive is byte-identical.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import io
import re
import tarfile
from dataclasses import dataclass, field, replace

from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import in_serving_layer
from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import PROTECTED_LOCATIONS
from ansible_collections.biv100.serving.plugins.plugin_utils import _patch_ops, _templates
from ansible_collections.biv100.serving.plugins.plugin_utils._figure_cells import SIM, number
from ansible_collections.biv100.serving.plugins.plugin_utils._iterations import COLUMNS as BRIEF_COLUMNS
from ansible_collections.biv100.serving.plugins.plugin_utils._iterations import brief_rows, union_by_host

RUN_FILE = "computility-run.yaml"
SCRIPT = "patch_ops.sh"
MANIFEST = "MANIFEST"
README = "README.md"
README_TEMPLATE = "submission/README.md.j2"
SUMS = "SHA256SUMS"
PAYLOAD = "files"
SCRIPT_MODE = 0o755
FILE_MODE = 0o644
DIRECTORY_MODE = 0o755

# What the README's table shows of a change planned but not built yet.
NOT_BUILT = "not yet built"
# What MANIFEST writes for "no such file" and for a fact the record does not hold.
ABSENT = "-"
VARIANT_ID_LENGTH = 12

RELEASE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PATH_PATTERN = re.compile(r"[A-Za-z0-9_./-]+")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
# MANIFEST is tab separated and joins a variant's hosts with ",": a host name or a version that
# holds either (or a line break) would change what the script reads.
HOST_PATTERN = re.compile(r"[^\s,]+")
VERSION_PATTERN = re.compile(r"[A-Za-z0-9.+!_-]+")
STATUSES = ("pending", "good", "failed", "rolled_back")

BEFORE_RUN_DOCUMENTS = "recorded before run documents were kept (no engine.platform_run in its record)"


class SubmissionError(ValueError):
    """A bundle that cannot be built; the message names the host and the path."""


@dataclass(frozen=True)
class Row:
    """One path of a variant: the vendor's digest (base) and the release's (result), None = absent."""

    path: str
    base: str | None
    result: str | None

    @property
    def installed(self) -> bool:
        return self.result != self.base


@dataclass(frozen=True)
class Variant:
    """One vendor base and what the release makes of it, on the hosts that have that base."""

    id: str
    vllm_version: str
    hosts: tuple[str, ...]
    rows: tuple[Row, ...]  # every path of the union, sorted
    payload: dict[str, bytes] = field(compare=False)  # path -> bytes of each installed file

    @property
    def installed(self) -> list[str]:
        return [row.path for row in self.rows if row.installed]

    @property
    def kept(self) -> list[str]:
        return [row.path for row in self.rows if not row.installed]

    def summary(self) -> dict:
        return {"id": self.id, "vllm_version": self.vllm_version, "hosts": list(self.hosts),
                "installed": self.installed, "kept": self.kept}


@dataclass(frozen=True)
class LeftOut:
    host: str
    reason: str


@dataclass(frozen=True)
class Bundle:
    release: str
    reference: str
    statuses: dict[str, str]  # every named host, in the order given
    forced: tuple[tuple[str, str], ...]  # (host, status) of each named host it is not good on, sorted
    variants: tuple[Variant, ...]  # sorted by id
    left_out: tuple[LeftOut, ...]  # sorted by host
    files: dict[str, bytes]  # relative path -> bytes, sorted by path (byte order)

    @staticmethod
    def mode(path: str) -> int:
        return SCRIPT_MODE if path == SCRIPT else FILE_MODE

    @property
    def directories(self) -> list[str]:
        """Every folder below the bundle's own that its files need, sorted."""
        return sorted({"/".join(path.split("/")[:depth]) for path in self.files
                       for depth in range(1, path.count("/") + 1)}, key=_byte_order)


@dataclass
class _Host:
    name: str
    interpreter: str
    status: str
    record: dict
    contents: dict  # path -> base64 of the bytes the release installed there
    vendor: dict
    unsafe: dict  # path -> why the host could not read the vendor's file there


# --- deciding --------------------------------------------------------------------------------


def build(release: str, hosts: list[dict], *, reference: str | None = None, force: bool = False) -> Bundle:
    """The bundle of `release` from the exports of the named hosts (see the module's text)."""
    if not isinstance(release, str) or not RELEASE_PATTERN.fullmatch(release):
        raise SubmissionError(f"release {release!r}: a release id is letters, digits, '.', '_' and '-', "
                              "not starting with '.' or '-'")
    named = [_host(release, entry) for entry in _entries(hosts)]
    reference = named[0].name if reference in (None, "") else reference
    by_name = {host.name: host for host in named}
    if reference not in by_name:
        raise SubmissionError(f"reference host {reference} is not one of the named hosts "
                              f"({', '.join(by_name)})")

    not_good = tuple(sorted((host.name, host.status) for host in named if host.status != "good"))
    if not_good and not force:
        raise SubmissionError(
            f"release {release} is not good on {_listed(not_good)}: only a release the fleet proved good "
            "is submitted (force builds it anyway, and its README says so)")

    run_document = _platform_run(by_name[reference])
    if run_document is None:
        raise SubmissionError(
            f"host {reference}: release {release} was {BEFORE_RUN_DOCUMENTS}, so its run document is "
            "unknown: deploy it again under a new release id")
    included, left_out = [by_name[reference]], []
    for host in named:
        if host.name == reference:
            continue
        reason = _engine_difference(reference, run_document, _platform_run(host))
        if reason:
            left_out.append(LeftOut(host.name, reason))
        else:
            included.append(host)

    variants = _variants(included)
    try:
        script = _patch_ops.render(release, sorted({host.interpreter for host in included}))
    except ValueError as error:
        raise SubmissionError(f"patch_ops.sh: {error}") from None
    bundle = Bundle(
        release=release,
        reference=reference,
        statuses={host.name: host.status for host in named},
        forced=not_good,
        variants=tuple(variants),
        left_out=tuple(sorted(left_out, key=lambda item: item.host)),
        files={},
    )
    files = {RUN_FILE: run_document.encode("utf-8"), SCRIPT: script.encode("utf-8"),
             MANIFEST: manifest(bundle).encode("utf-8")}
    for variant in variants:
        for path, data in variant.payload.items():
            files[f"{PAYLOAD}/{variant.id}/{path}"] = data
    files[README] = readme(bundle, by_name[reference].record, included).encode("utf-8")
    files[SUMS] = sha256sums(files).encode("utf-8")
    return replace(bundle, files=dict(sorted(files.items(), key=lambda item: _byte_order(item[0]))))


def _entries(hosts) -> list[dict]:
    if not isinstance(hosts, (list, tuple)) or not hosts:
        raise SubmissionError("no hosts named: a bundle is built from the exports of the hosts that proved the release")
    seen = set()
    for position, entry in enumerate(hosts, 1):
        if not isinstance(entry, dict):
            raise SubmissionError(f"hosts[{position}] is not a mapping of name, interpreter and export")
        name = entry.get("name")
        if not isinstance(name, str) or not HOST_PATTERN.fullmatch(name):
            raise SubmissionError(f"hosts[{position}]: name {name!r} is not a host name "
                                  "(no spaces, no commas)")
        if name in seen:
            raise SubmissionError(f"host {name} is named twice")
        seen.add(name)
    return list(hosts)


def _host(release: str, entry: dict) -> _Host:
    name = entry["name"]
    export = entry.get("export")
    if not isinstance(export, dict) or export.get("status") is None:
        raise SubmissionError(f"host {name} does not hold release {release}")
    if export.get("release") not in (None, release):
        raise SubmissionError(f"host {name}: the export is of release {export.get('release')}, not {release}")
    if export["status"] not in STATUSES:
        raise SubmissionError(f"host {name}: release {release} has the unknown status {export['status']!r}")
    record = export.get("record")
    if not isinstance(record, dict):
        raise SubmissionError(f"host {name}: release {release} has no record in its export")
    for key in ("contents", "vendor"):
        if not isinstance(export.get(key), dict):
            raise SubmissionError(f"host {name}: the export of release {release} has no {key} mapping")
    interpreter = entry.get("interpreter")
    if not isinstance(interpreter, str) or not interpreter:
        raise SubmissionError(f"host {name}: no interpreter (vllm_facts' interpreter on that host)")
    unsafe = export.get("unsafe") if isinstance(export.get("unsafe"), dict) else {}
    return _Host(name, interpreter, export["status"], record, export["contents"], export["vendor"], unsafe)


def _listed(pairs) -> str:
    return ", ".join(f"{host} ({status})" for host, status in pairs)


def _platform_run(host: _Host) -> str | None:
    """The run document the release recorded. The platform runs one engine: on a host of several
    instances, the run document of the first by name (the record keeps them sorted)."""
    engine = _first_instance(host.record.get("engine"))
    text = engine.get("platform_run") if isinstance(engine, dict) else None
    return text if isinstance(text, str) and text.strip() else None


def _first_instance(part):
    """The entry of a record's part (engine, gates: {"instances": {...}}) for the instance the
    bundle carries, the first by name; None when the part names none."""
    if isinstance(part, dict) and isinstance(part.get("instances"), dict) and part["instances"]:
        return part["instances"][min(part["instances"])]
    return None


def _engine_difference(reference: str, expected: str, text: str | None) -> str | None:
    """Why a host's run document keeps it out of the bundle, naming its first differing line."""
    if text is None:
        return BEFORE_RUN_DOCUMENTS
    if text == expected:
        return None
    ours, theirs = text.splitlines(), expected.splitlines()
    for line_number, (line, wanted) in enumerate(zip(ours, theirs), 1):
        if line != wanted:
            return (f"runs another engine: {line.strip()} (line {line_number} of its {RUN_FILE}, "
                    f"where {reference}'s has {wanted.strip()})")
    line_number = min(len(ours), len(theirs)) + 1
    if len(ours) > len(theirs):
        return (f"runs another engine: {ours[line_number - 1].strip()} (line {line_number} of its {RUN_FILE}, "
                f"where {reference}'s has ended)")
    if len(ours) < len(theirs):
        return (f"runs another engine: its {RUN_FILE} ends at line {line_number}, "
                f"where {reference}'s has {theirs[line_number - 1].strip()}")
    # The same lines with other line ends, or no final newline: still not the same bytes.
    return f"runs another engine: its {RUN_FILE} differs from {reference}'s in its line endings"


def _check_path(host: str, path) -> str:
    if not isinstance(path, str) or not PATH_PATTERN.fullmatch(path) or path.startswith("/") or any(
            part in ("", ".", "..") for part in path.split("/")):
        raise SubmissionError(f"host {host}: {path!r} is not a package path (letters, digits and _.-/, "
                              "relative, no empty, '.' or '..' component)")
    if not in_serving_layer(path):
        raise SubmissionError(f"host {host}: {path} is outside the serving layer")
    if path in PROTECTED_LOCATIONS:
        raise SubmissionError(f"host {host}: {path} is one of the protected files")
    return path


def _digest(host: str, path: str, value, what: str) -> str | None:
    if value is None or (isinstance(value, str) and SHA256_PATTERN.fullmatch(value)):
        return value
    raise SubmissionError(f"host {host}: {path}: {what} {value!r} is not a sha256 (64 lowercase hex) or null")


def _variants(included: list[_Host]) -> list[Variant]:
    digests = {}
    for host in included:
        record_digests = host.record.get("digests")
        if not isinstance(record_digests, dict):
            raise SubmissionError(f"host {host.name}: the release record has no digests")
        digests[host.name] = {_check_path(host.name, path): _digest(host.name, path, value, "the release's digest")
                              for path, value in record_digests.items()}
    union = sorted({path for table in digests.values() for path in table}, key=_byte_order)

    groups: dict[tuple, list[tuple[_Host, tuple[Row, ...]]]] = {}
    for host in sorted(included, key=lambda item: item.name):
        rows = []
        for path in union:
            if path not in host.vendor:
                why = f": {host.unsafe[path]}" if path in host.unsafe else ""
                raise SubmissionError(f"host {host.name} does not report the vendor's digest of {path}{why}")
            base = _digest(host.name, path, host.vendor[path], "the vendor's digest")
            result = digests[host.name].get(path, base)
            if result is None and base is not None:
                raise SubmissionError(
                    f"host {host.name}: release would remove {path}, which the vendor's base has "
                    f"(sha256 {base}): a submission only installs files")
            rows.append(Row(path, base, result))
        table = tuple((row.path, row.base) for row in rows)
        groups.setdefault(table, []).append((host, tuple(rows)))

    variants = []
    for table, members in groups.items():
        first_host, rows = members[0]
        for host, other_rows in members[1:]:
            for mine, theirs in zip(rows, other_rows):
                if mine.result != theirs.result:
                    raise SubmissionError(
                        f"hosts {first_host.name} and {host.name} have the same vendor base but installed "
                        f"different files at {mine.path} ({_short(mine.result)} and {_short(theirs.result)})")
        payload = {row.path: _content([host for host, _rows in members], row) for row in rows if row.installed}
        variants.append(Variant(
            id=variant_id(table),
            vllm_version=_version([host for host, _rows in members]),
            hosts=tuple(host.name for host, _rows in members),
            rows=rows,
            payload=payload,
        ))
    return sorted(variants, key=lambda variant: variant.id)


def variant_id(table) -> str:
    """The first 12 hex of sha256 over the sorted "path\\tbase\\n" lines of a base table."""
    lines = sorted(f"{path}\t{base or ABSENT}\n" for path, base in table)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()[:VARIANT_ID_LENGTH]


def _content(members: list[_Host], row: Row) -> bytes:
    """The installed bytes of a path, as every host of the variant kept them, checked by sha256."""
    found = None
    for host in members:
        encoded = host.contents.get(row.path)
        if not isinstance(encoded, str):
            raise SubmissionError(f"host {host.name}: the export holds no content for {row.path} "
                                  f"(releases/<id>/files/{row.path} on the host)")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise SubmissionError(f"host {host.name}: the content of {row.path} is not base64") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != row.result:
            raise SubmissionError(f"host {host.name}: the kept content of {row.path} has sha256 {digest}, "
                                  f"the release recorded {row.result}")
        found = data
    return found


def _version(members: list[_Host]) -> str:
    versions = set()
    for host in members:
        version = host.record.get("vllm_version")
        if version in (None, ""):
            continue
        if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
            raise SubmissionError(f"host {host.name}: vllm_version {version!r} is not a version string")
        versions.add(version)
    return ",".join(sorted(versions)) or ABSENT


def _short(digest: str | None) -> str:
    return f"sha256 {digest[:12]}..." if digest else "absent"


def _byte_order(path: str) -> bytes:
    return path.encode("utf-8")


# --- the bundle's own files ------------------------------------------------------------------


def manifest(bundle: Bundle) -> str:
    lines = [f"# biv100.serving submission {bundle.release}: read by {SCRIPT}; see {README}"]
    lines += ["\t".join(("variant", variant.id, variant.vllm_version, ",".join(variant.hosts)))
              for variant in bundle.variants]
    lines += ["\t".join(("file", variant.id, row.path, row.base or ABSENT, row.result or ABSENT))
              for variant in bundle.variants for row in variant.rows]
    return "\n".join(lines) + "\n"


def sha256sums(files: dict[str, bytes]) -> str:
    """`sha256sum` lines of every file but SHA256SUMS itself, sorted by path in byte order."""
    return "".join(f"{hashlib.sha256(files[path]).hexdigest()}  {path}\n"
                   for path in sorted((path for path in files if path != SUMS), key=_byte_order))


def _cell(value) -> str:
    """A Markdown table cell holding value: no line break, a pipe or a backslash of its own."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def _code(path: str) -> str:
    return f"`{path}`"


def readme(bundle: Bundle, record: dict, included: list) -> str:
    """README.md, files/submission/README.md.j2 filled in with the bundle and the reference
    host's release record."""
    reference = bundle.reference
    status = bundle.statuses[reference]
    gates = _first_instance(record.get("gates"))
    gates = gates if isinstance(gates, dict) else {}
    bench = gates.get("bench") if isinstance(gates.get("bench"), dict) else None
    quality = gates.get("quality") if isinstance(gates.get("quality"), dict) else None
    return _templates.render(
        README_TEMPLATE, filters={"cell": _cell, "code": _code},
        release=bundle.release, reference=reference, status=status,
        proven=sorted(host.name for host in included if host.status == "good"),
        forced=_listed(bundle.forced), forced_hosts=len(bundle.forced),
        run_file=RUN_FILE, script=SCRIPT, manifest=MANIFEST, payload=PAYLOAD, readme=README, sums=SUMS,
        recorded_verdict=_recorded_verdict(record, status),
        quality={"verdict": _verdict(quality.get("passed") if quality else None, quality),
                 "figures": _quality_figures(quality)},
        bench={"verdict": _verdict((bench.get("gate") or {}).get("passed") if bench else None, bench),
               "figures": _bench_figures(bench)},
        simulated=any(figures and figures.get("simulated") for figures in (bench, quality)), sim=SIM,
        columns=BRIEF_COLUMNS, changes=_changes(included), failure_points=_recorded(included, "failure_points"),
        variants=[{"id": variant.id, "hosts": variant.hosts, "installed": variant.installed, "kept": variant.kept,
                   "version": variant.vllm_version if variant.vllm_version != ABSENT else "not recorded"}
                  for variant in bundle.variants],
        left_out=bundle.left_out,
    )


def _recorded_verdict(record: dict, status: str) -> str:
    """The record's own words on its status: when and why, from the last history entry of it."""
    history = [entry for entry in record.get("history") or [] if isinstance(entry, dict)]
    entries = [entry for entry in history if entry.get("status") == status]
    created = record.get("created_at")
    parts = [f"Staged at {created}." if created else ""]
    if entries:
        last = entries[-1]
        when = f" at {last['at']}" if last.get("at") else ""
        why = f": {_cell(last['reason'])}" if last.get("reason") else ""
        parts.append(f"Marked {status}{when}{why}.")
    return " ".join(part for part in parts if part)


def _verdict(passed, figures) -> str:
    if figures is None:
        return "not measured"
    if passed is True:
        return "passed"
    if passed is False:
        return "**FAILED**"
    return "no verdict"


def _marked(text: str, figures: dict) -> str:
    return f"{text} {SIM}" if figures.get("simulated") else text


def _quality_figures(quality: dict | None) -> str:
    if quality is None or number(quality.get("score")) is None:
        return "-"
    text = f"score {number(quality['score']):.3f}"
    if number(quality.get("correct")) is not None and number(quality.get("cases")) is not None:
        text += f" ({quality['correct']:g}/{quality['cases']:g} correct)"
    deviation, bound = number(quality.get("deviation")), number(quality.get("bound"))
    baseline = quality.get("baseline") if isinstance(quality.get("baseline"), dict) else None
    if deviation is not None:
        versus = ""
        if baseline and baseline.get("release"):
            score = number(baseline.get("score"))
            versus = f" from {baseline['release']}" + (f" ({score:.3f})" if score is not None else "")
        text += f", deviation {100 * deviation:+.1f} %{versus}"
    elif quality.get("baseline") is None:
        text += ", no baseline to compare with yet"
    if bound is not None:
        text += f", gate ±{100 * bound:g} %"
    return _marked(text, quality)


def _bench_figures(bench: dict | None) -> str:
    if bench is None or number(bench.get("score")) is None:
        return "-"
    gate = bench.get("gate") if isinstance(bench.get("gate"), dict) else {}
    weights = bench.get("weights") if isinstance(bench.get("weights"), dict) else {}
    text = f"score {number(bench['score']):.0f}"
    if number(gate.get("score")) is not None:
        text += f" (gate ≥ {number(gate['score']):g})"
    if number(weights.get("output")) is not None and number(weights.get("input")) is not None:
        text += f" = {weights['output']:g} × output + {weights['input']:g} × input tok/s"
    rates = [(label, number(bench.get(key))) for key, label in
             (("output_tps", "output tok/s"), ("input_tps", "input tok/s"), ("total_tps", "total tok/s"),
              ("request_tps", "requests/s"))]
    text += "".join(f"; {value:.1f} {label}" for label, value in rates if value is not None)
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        figures = bench.get(key) if isinstance(bench.get(key), dict) else {}
        shown = [(name, number(figures.get(name))) for name in ("p50", "p90", "p99")]
        shown = [(name, value) for name, value in shown if value is not None]
        if shown:
            text += (f"; {label} {'/'.join(name for name, _value in shown)} "
                     f"{'/'.join(f'{value:.1f}' for _name, value in shown)} ms")
    requests = bench.get("requests") if isinstance(bench.get("requests"), dict) else {}
    if number(requests.get("ok")) is not None:
        text += f"; {requests['ok']:g} requests" + (
            f", {requests['failed']:g} failed" if number(requests.get("failed")) else "")
    if bench.get("workload"):
        text += f"; workload {bench['workload']}"
    return _marked(text, bench)


def _changes(included: list) -> list[list[str]]:
    """The cells of the brief's table: what the release changed against the last good release on
    each included host, once each (naming the hosts of a change not every host made), then the
    changes the payload plans but has not built."""
    recorded = {host.name: [row for row in host.record.get("changes") or [] if isinstance(row, dict)]
                for host in included if isinstance(host.record.get("changes"), list)}
    rows = brief_rows(union_by_host(recorded)) if recorded else []
    for planned in _recorded(included, "planned"):
        rows.append([str(planned.get(key) or "") for key in ("source", "place", "change")] + [NOT_BUILT, ""])
    return rows


def _recorded(included: list, key: str) -> list[dict]:
    """A list the releases record alike on every host (the manifest's failure points, its planned
    mappings): the first included host's that has one."""
    for host in included:
        found = host.record.get(key)
        if isinstance(found, list) and found:
            return [item for item in found if isinstance(item, dict)]
    return []


# --- the archive -----------------------------------------------------------------------------


def archive(bundle: Bundle) -> bytes:
    """The folder under the top directory <release>/ as a .tar.gz that depends on nothing but the
    bundle: sorted entries, mtime 0 (the gzip header's too, which also names no file), owner
    0:0 without names, 0755 for folders and the script, 0644 for the rest."""
    entries = [(bundle.release, None)]
    entries += [(f"{bundle.release}/{folder}", None) for folder in bundle.directories]
    entries += [(f"{bundle.release}/{path}", path) for path in bundle.files]
    entries.sort(key=lambda entry: _byte_order(entry[0]))
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path is None:
                info.type = tarfile.DIRTYPE
                info.mode = DIRECTORY_MODE
                tar.addfile(info)
            else:
                data = bundle.files[path]
                info.mode = bundle.mode(path)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    compressed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=9) as stream:
        stream.write(tar_bytes.getvalue())
    return compressed.getvalue()

"""Tuning logs: MetaSchedule JSON databases, one folder per target, and the best point per layer and batch.

    tuning_logs/<target>/database_workload.json        MetaSchedule's workload table
    tuning_logs/<target>/database_tuning_record.json   its tuning records (one measured point each)
    tuning_logs/<target>/runs.jsonl                    one line per tuning run: device, date, trials, time

<target> is `cuda-<arch>` or `cpu-<mcpu>`. Runs append to the same database, so logs of several runs
merge; other `<prefix>workload.json` / `<prefix>tuning_record.json` pairs in the folder (a log copied
from another machine) are read too. A damaged pair, or records made for another target, are reported
and skipped: a bad log never stops a compile. The default folder is read together with the logs bundled
with tvmrnn; bundled records timed on kernels that have changed since are dropped without a word (`-v`: a count).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import tvm_ffi

from ..errors import UnsupportedModelError
from .tasks import layer_key, task_of

WORKLOAD = "workload.json"
RECORDS = "tuning_record.json"
GRAPH_PREFIX = "graph_"  # the graph functions' database (tuning.graph_tasks), read by MetaSchedule at compile
FAILED = 1e9  # MetaSchedule stores 1e10 s for a candidate that failed to build or run


def default_logs_dir() -> Path:
    """Where `tvmrnn tune` writes and compile reads: $TVMRNN_TUNING_LOGS, else the user's cache
    ($XDG_CACHE_HOME or ~/.cache)/tvmrnn/tuning_logs. Never the installed package: compile reads its bundled logs too."""
    if os.environ.get("TVMRNN_TUNING_LOGS"):
        return Path(os.environ["TVMRNN_TUNING_LOGS"])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "tvmrnn" / "tuning_logs"


def bundled_logs_dir() -> Path | None:
    """The logs that come with tvmrnn (the checkout's tuning_logs/), read along with the default folder, never written."""
    bundled = Path(__file__).resolve().parents[2] / "tuning_logs"
    return bundled if bundled.is_dir() else None


def verbose() -> bool:
    """`-v` on the command line (it sets TVMRNN_VERBOSE): report what is otherwise left unsaid."""
    return bool(os.environ.get("TVMRNN_VERBOSE"))


def _arch(target) -> str:
    # sm_90a (the H100 tag, arch-specific features) and sm_90 (what the device reports) are one GPU family
    return str((target.attrs or {}).get("arch", "unknown")).rstrip("a")


def target_name(target) -> str:
    attrs = target.attrs or {}
    if target.kind.name == "cuda":
        return f"cuda-{_arch(target)}"
    return f"{'cpu' if target.kind.name == 'llvm' else target.kind.name}-{attrs.get('mcpu', 'generic')}"


def target_dir(logs_dir, target) -> Path:
    return Path(logs_dir) / target_name(target)


def check_json_lines(path: Path, kind: str) -> str | None:
    """Why a database file cannot be MetaSchedule's (None if it looks sound), without letting TVM parse it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        return f"cannot be read ({err})"
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return f"line {no} is not JSON ({err.msg})"
        ok = (isinstance(row, list) and len(row) == 2 and
              (all(isinstance(x, str) for x in row) if kind == WORKLOAD else isinstance(row[0], int) and isinstance(row[1], list)))
        if not ok:
            return f"line {no} is not a MetaSchedule {kind[:-5].replace('_', ' ')} row"
    return None


def _pairs(folder: Path):
    """The recurrent kernels' databases (graph_*: the graph functions', read by graph_pipeline through MetaSchedule)."""
    for wl in sorted(folder.glob(f"*{WORKLOAD}")):
        if wl.name.startswith(GRAPH_PREFIX):
            continue
        yield wl, wl.with_name(wl.name[: -len(WORKLOAD)] + RECORDS)


def open_database(folder: Path, prefix: str = "database_"):
    """The run's writable database in `folder`; refuses (clearly) to append to a damaged one."""
    from tvm.s_tir import meta_schedule as ms

    folder.mkdir(parents=True, exist_ok=True)
    wl, rec = folder / f"{prefix}{WORKLOAD}", folder / f"{prefix}{RECORDS}"
    for path, kind in ((wl, WORKLOAD), (rec, RECORDS)):
        problem = path.exists() and check_json_lines(path, kind)
        if problem:
            raise UnsupportedModelError(f"tuning log {path} is damaged: {problem}; move it away (or pass another --logs) to tune")
    return ms.database.JSONDatabase(str(wl), str(rec), allow_missing=True)


def _current(task, workload, target, templates: dict) -> bool:
    """Whether a record's workload is today's template for its task: the kernel's arguments (R's layout among them) as
    this version builds them. A layer's key names its shape, not its kernel, so without this a log timed on an older
    kernel would mix its times with today's."""
    key = task.key()
    if key not in templates:
        templates[key] = task.template(target)
    return tvm_ffi.structural_equal(workload, templates[key])


def _same_target(a, b) -> bool:
    return target_name(a) == target_name(b)


@dataclass
class TuningLogs:
    """The measured points of every readable log for one target, indexed by layer and batch."""

    target: object
    folder: Path
    problems: list[str] = field(default_factory=list)  # damaged or foreign logs, each in one line
    records: int = 0
    # layer key (JSON) -> batch -> [(seconds per step, KernelConfig)]
    points: dict = field(default_factory=dict)
    also_read: list = field(default_factory=list)  # the bundled folder, where it was read too
    defaults_won: int = 0  # layer buckets whose tuned point tune's whole-module check found no faster: they run the default

    @property
    def where(self) -> str:
        """The folders read, for messages."""
        return " and ".join(str(f) for f in [self.folder] + self.also_read)

    @staticmethod
    def load(logs_dir, target) -> TuningLogs:
        """The logs of `logs_dir` for target; for the default folder, with the bundled logs too."""
        logs = TuningLogs(target, target_dir(logs_dir, target))
        bundled = bundled_logs_dir()
        templates: dict = {}
        if logs.folder.is_dir():
            logs._read_folder(logs.folder, templates, bundled=False)
        if bundled is not None and Path(logs_dir).resolve() == default_logs_dir().resolve() and target_dir(bundled, target).is_dir():
            logs.also_read.append(target_dir(bundled, target))
            logs._read_folder(target_dir(bundled, target), templates, bundled=True)
        logs._drop_buckets_the_default_won()  # after the bundled points too: the one that lost may have been one of theirs
        return logs

    def _drop_buckets_the_default_won(self) -> None:
        """A bucket whose best point is one the whole-module check found no faster than the default runs the default."""
        path = self.folder / VERDICTS
        if not path.exists():
            return
        for line in path.read_text().splitlines():
            try:
                verdict = json.loads(line)
                lost, batch, points = verdict["kept_default"], int(verdict["batch"]), dict(verdict["points"])
            except (ValueError, KeyError, TypeError):
                continue  # a damaged line says nothing
            for key, config in points.items() if lost else ():
                pts = self.points.get(key, {}).get(batch)
                if pts and min(pts, key=lambda p: p[0])[1].as_dict() == config:
                    del self.points[key][batch]
                    self.defaults_won += 1

    def _read_folder(self, folder: Path, templates: dict, bundled: bool) -> None:
        from tvm.s_tir import meta_schedule as ms

        for wl, rec in _pairs(folder):
            problem = check_json_lines(wl, WORKLOAD) or (check_json_lines(rec, RECORDS) if rec.exists() else f"{rec.name} is missing")
            if problem:
                self.problems.append(f"tuning log {wl.parent / wl.name[: -len(WORKLOAD)]}* skipped: {problem}")
                continue
            try:
                db = ms.database.JSONDatabase(str(wl), str(rec), allow_missing=False)
                records = db.get_all_tuning_records()
            except Exception as err:  # TVM's parser: a row that is JSON but not a workload/record
                self.problems.append(f"tuning log {wl} skipped: MetaSchedule cannot read it ({str(err).splitlines()[-1]})")
                continue
            foreign, changed = self._add_records(records, templates)
            if foreign and not bundled:
                self.problems.append(f"tuning log {wl}: records for {', '.join(sorted(foreign))} skipped "
                                     f"(this target is {target_name(self.target)})")
            if changed and (verbose() or not bundled):
                self.problems.append(f"tuning log {wl}: {changed} record(s) skipped, timed on kernels whose arguments have "
                                     f"changed since" + ("" if bundled else " (re-tune to replace them)"))

    def _add_records(self, records, templates: dict) -> tuple[set, int]:
        """Index today's records for this target; returns the foreign targets seen and how many records are stale."""
        from .search import config_of_trace

        foreign, changed = set(), 0
        for r in records:
            task = task_of(r.workload.mod)
            if task is None or not _same_target(r.target, self.target):
                foreign.add(target_name(r.target) if task is not None else "a workload that is not a tvmrnn kernel")
                continue
            if not _current(task, r.workload.mod, self.target, templates):
                changed += 1  # timed on a kernel whose arguments (say, R's layout) have changed since
                continue
            secs = [float(s) for s in (r.run_secs or [])]
            if not secs or min(secs) >= FAILED:
                continue
            key = json.dumps(layer_key(task.spec), sort_keys=True)
            per_step = sum(secs) / len(secs) / max(task.seq, 1)
            self.points.setdefault(key, {}).setdefault(task.batch, []).append((per_step, config_of_trace(r.trace, r.workload.mod)))
            self.records += 1
        return foreign, changed

    def best(self, spec) -> dict:
        """{batch: [(KernelConfig, seconds per step), best first]} for a layer (what schedules.plan_kernel takes)."""
        found = self.points.get(json.dumps(layer_key(spec), sort_keys=True), {})
        out = {}
        for batch, pts in found.items():
            seen = {}
            for t, cfg in sorted(pts, key=lambda p: p[0]):
                seen.setdefault(cfg, t)
            out[batch] = list(seen.items())
        return out

    def best_seconds(self, spec, batch: int, config) -> float | None:
        pts = self.points.get(json.dumps(layer_key(spec), sort_keys=True), {}).get(batch, [])
        times = [t for t, c in pts if c == config]
        return min(times) if times else None


VERDICTS = "verdicts.jsonl"  # whole-module times of default against tuned, per batch bucket (tvmrnn tune writes them)


def record_verdict(logs: TuningLogs, specs, batch: int, default_ms: float, tuned_ms: float) -> None:
    """Record one bucket's side-by-side times with the point each layer ran; where the tuned module was not faster,
    TuningLogs.load drops those points' bucket, so compile keeps the default (until a new best point comes)."""
    points = {}
    for spec in specs:
        best = logs.best(spec).get(batch)
        if best:
            points[json.dumps(layer_key(spec), sort_keys=True)] = best[0][0].as_dict()
    entry = {"batch": batch, "default_ms": round(default_ms, 4), "tuned_ms": round(tuned_ms, 4),
             "kept_default": tuned_ms >= default_ms, "points": points}
    logs.folder.mkdir(parents=True, exist_ok=True)
    with open(logs.folder / VERDICTS, "a") as f:
        f.write(json.dumps(entry) + "\n")


def record_run(folder: Path, entry: dict) -> None:
    with open(folder / "runs.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")

"""Models found in a folder: `[server] models_dir` serves every `*.gguf` in it under its
file stem, without a `[models.NAME]` table per model.

`scan()` is the pure part: a folder's listing in, model names and their files out, with
what is wrong and what was passed over. `list_folder()` and `fingerprint()` are the I/O.

Decisions, and why:
- The folder is read, and each subfolder one level down, never deeper. A subfolder is a
  folder per model, as llama-server's router mode lays out a multimodal or split model
  (`gemma-3-4b/gemma-3-4b-Q8_0.gguf` beside `gemma-3-4b/mmproj-F16.gguf`): when its
  `*.gguf` files make exactly one model (one file, or one split set), it is that model,
  named after the subfolder, with the subfolder's one projector as its `mmproj`. A
  subfolder that makes several models is passed over with a warning: a models folder often
  sits beside a download cache or an `old/` tree, which must not be served under names that
  clash (llama-server's router takes whichever file it lists last); one with none (a
  Hugging Face cache's `models--org--name/`, whose files lie deeper) is passed over
  silently. A model kept elsewhere is one symlink (followed) away.
- A split GGUF (`NAME-00001-of-00003.gguf`, llama.cpp's gguf-split naming) is one model
  NAME whose file is the first part: llama.cpp finds the others from it. A set with a part
  missing, or with parts that disagree on the count, is a config problem, as a missing
  `path` is.
- Files that cannot be served *yet* are passed over with a warning rather than failing the
  config, so that one file being copied in does not hold back every other change: hidden
  files (editors' and rsync's temporaries) silently, and a file whose header is not
  (yet) a GGUF's. A multimodal projector (`mmproj-*.gguf`, architecture "clip") is not a
  model of its own either: it is paired with the model it serves (`pair_projectors`), as
  llama-server's router mode finds an `mmproj*.gguf` beside a model: the one model of the
  folder, else the model whose name the projector's (less "mmproj") starts the same way as
  no other model's does. A projector that fits no model, or two equally, is passed over
  with a warning; a table's own `mmproj` wins.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from supervisor.config import gguf_meta

log = logging.getLogger("corral.models_dir")

SUFFIX = ".gguf"
_SPLIT = re.compile(r"(?P<name>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


@dataclass(frozen=True)
class Entry:
    """One file of the folder (subfolders are never entries)."""

    name: str
    # Why this file cannot be served now (its header is not a GGUF's, ...), or None.
    unusable: str | None = None
    projector: bool = False  # a multimodal projector (architecture "clip")


@dataclass(frozen=True)
class Found:
    models: dict[str, str] = field(default_factory=dict)  # model name -> file name (first part)
    problems: list[str] = field(default_factory=list)  # "FILE: what is wrong"
    skipped: list[str] = field(default_factory=list)  # "FILE: why", for a warning
    # Model name -> (its first file, why it was skipped), of those skipped.
    not_ready: dict[str, tuple[str, str]] = field(default_factory=dict)
    projectors: dict[str, str] = field(default_factory=dict)  # model name -> its mmproj file


def is_candidate(name: str) -> bool:
    """A file name the folder's scan looks at: `*.gguf`, any case, not hidden (`name` may
    start with a subfolder's `NAME/`)."""
    return name.lower().endswith(SUFFIX) and not name.rpartition("/")[2].startswith(".")


def scan(entries: Iterable[Entry], folders: Mapping[str, Iterable[Entry]] | None = None) -> Found:
    """The models a folder's files make, and its subfolders' (`folders`: a subfolder's name
    -> its listing, whose names start with `NAME/`). Pure: the arguments are the listings."""
    found = _scan_files(entries)
    for sub, listing in sorted((folders or {}).items()):
        _add_folder(found, sub, list(listing))
    return found


def _add_folder(found: Found, sub: str, listing: list[Entry]) -> None:
    """Subfolder `sub`, from its listing, as the one model `sub` of `found`."""
    projectors = [e.name for e in listing if e.projector and is_candidate(e.name)]
    inner = _scan_files([e for e in listing if not e.projector])
    found.problems.extend(inner.problems)
    found.skipped.extend(inner.skipped)
    names = list(inner.models) + list(inner.not_ready)
    if not names:
        return  # no model here: a cache's folder, or a projector alone
    if len(names) > 1:
        found.skipped.append(f"{sub}/: {len(names)} models in one folder; a folder per model holds one")
    elif not sub.strip() or not sub.isprintable():
        found.problems.append(f"{sub!r}/: {sub!r} cannot be a model name (rename the folder)")
    elif sub in found.models or sub in found.not_ready:
        found.problems.append(f"{sub}/: would be model {sub!r} too; rename the folder or the file")
    elif names[0] in inner.not_ready:
        found.not_ready[sub] = inner.not_ready[names[0]]
    else:
        found.models[sub] = inner.models[names[0]]
        if len(projectors) == 1:
            found.projectors[sub] = projectors[0]
        elif projectors:
            found.skipped.append(f"{sub}/: {len(projectors)} multimodal projectors; name one as the model's mmproj")


def _scan_files(entries: Iterable[Entry]) -> Found:
    """The models one folder's own files make."""
    found = Found()
    # Model name -> the groups of files that would be it: one file, or a split set's
    # parts in order. Two groups for one name is a clash (a.gguf beside a-00001-of-...,
    # or A.gguf beside A.GGUF).
    groups: dict[str, list[list[Entry]]] = {}
    splits: dict[str, list[tuple[int, int, Entry]]] = {}  # NAME -> (part, count, entry)
    projectors: list[str] = []
    for e in sorted(entries, key=lambda e: e.name):
        if not is_candidate(e.name):
            continue
        if e.projector:
            projectors.append(e.name)
            continue
        if m := _SPLIT.fullmatch(e.name):
            splits.setdefault(m["name"], []).append((int(m["part"]), int(m["count"]), e))
        else:
            groups.setdefault(e.name[: -len(SUFFIX)], []).append([e])
    for name, parts in splits.items():
        if (problem := _split_problem(parts)) is not None:
            found.problems.append(problem)
            continue
        groups.setdefault(name, []).append([e for _, _, e in sorted(parts, key=lambda p: p[0])])
    for name, gs in sorted(groups.items()):
        first = gs[0][0].name
        if not name.strip() or not name.isprintable():
            found.problems.append(f"{first!r}: {name!r} cannot be a model name (rename the file)")
        elif len(gs) > 1:
            found.problems.append(f"{first}: {gs[1][0].name} would be model {name!r} too; rename one of them")
        elif bad := [e for e in gs[0] if e.unusable is not None]:
            found.skipped.extend(f"{e.name}: {e.unusable}" for e in bad)
            found.not_ready[name] = (first, "; ".join(f"{e.name}: {e.unusable}" for e in bad))
        else:
            found.models[name] = first
    paired, unpaired = pair_projectors(projectors, list(found.models))
    found.projectors.update(paired)
    found.skipped.extend(f"{p}: a multimodal projector that fits no one model of the folder by name" for p in unpaired)
    return found


def _stem(name: str) -> str:
    stem = name[: -len(SUFFIX)].lower() if name.lower().endswith(SUFFIX) else name.lower()
    return re.sub(r"mmproj", "", stem).strip("-_. ")


def pair_projectors(projectors: list[str], models: list[str]) -> tuple[dict[str, str], list[str]]:
    """Which projector file serves which model (pure): the folder's one model takes its one
    projector; otherwise each projector goes to the model whose name shares the longest
    start with the projector's name less "mmproj" (at least 4 characters), when no other
    model shares as much. Returns (model -> projector, projectors left unpaired)."""
    if len(projectors) == 1 and len(models) == 1:
        return {models[0]: projectors[0]}, []
    paired: dict[str, str] = {}
    left = []
    for p in projectors:
        key = _stem(p)
        scores = sorted(((_shared(key, m.lower()), m) for m in models), reverse=True)
        if scores and scores[0][0] >= 4 and (len(scores) == 1 or scores[1][0] < scores[0][0]) and scores[0][1] not in paired:
            paired[scores[0][1]] = p
        else:
            left.append(p)
    return paired, left


def _shared(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _split_problem(parts: list[tuple[int, int, Entry]]) -> str | None:
    """What is wrong with one split set's parts, naming a file of it, or None."""
    parts = sorted(parts, key=lambda p: p[0])
    first = parts[0][2].name
    counts = sorted({count for _, count, _ in parts})
    if len(counts) > 1:
        return f"{first}: split parts disagree on how many there are ({', '.join(f'{c:05d}' for c in counts)})"
    count = counts[0]
    have = {part for part, _, _ in parts}
    if bad := sorted(p for p in have if not 1 <= p <= count):
        return f"{first}: split part {bad[0]:05d} is outside 00001..{count:05d}"
    if missing := [p for p in range(1, count + 1) if p not in have]:
        return f"{first}: split set lacks part(s) {', '.join(f'{p:05d}' for p in missing)} of {count:05d}"
    return None


def list_folder(folder: Path, prefix: str = "") -> list[Entry]:
    """The folder's `*.gguf` files (symlinks followed), each with its header checked, named
    `prefix` + file name. Raises OSError."""
    entries = []
    for p in folder.iterdir():
        if not is_candidate(p.name):
            continue
        name = prefix + p.name
        if p.is_file():
            why = _header_problem(p)
            entries.append(Entry(name, None, True) if why == _PROJECTOR else Entry(name, why))
        elif p.is_symlink() and not p.exists():
            entries.append(Entry(name, f"a broken symbolic link (to {os.readlink(p)})"))
    return entries


def subfolders(folder: Path) -> list[Path]:
    """The folder's subfolders that may each be a model (links followed, hidden ones not).
    Raises OSError."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.is_dir())


def _header_problem(path: Path) -> str | None:
    """Why the file is not a servable GGUF: a file still being written has nothing yet, a
    few bytes short of a header, or not all of its tensors. Passed over rather than a
    config error, so that one copy in progress does not stop a reload of the rest."""
    if (why := gguf_meta.problem(path)) is not None:
        return f"{why.reason}; if it is still being copied in, a later reload picks it up"
    try:
        meta = gguf_meta.read_metadata(path, enough=lambda m: "general.architecture" in m)
    except (gguf_meta.NotGGUF, OSError) as exc:  # changed since the line above
        return f"cannot read: {exc}"
    if meta.get("general.architecture") == "clip":
        return _PROJECTOR
    return None


_PROJECTOR = "a multimodal projector (mmproj), not a model"


def found_in(folder: Path) -> Found:
    """`scan()` of the folder as it is now; an unreadable folder is a problem. Logs each
    file passed over."""
    if not folder.is_dir():
        return Found(problems=[f"{'not a folder' if folder.exists() else 'no such folder'}: {folder}"])
    unreadable = []
    try:
        entries, folders = list_folder(folder), {}
        for sub in subfolders(folder):
            try:
                folders[sub.name] = list_folder(sub, sub.name + "/")
            except OSError as exc:  # one unreadable subfolder holds back no other model
                unreadable.append(f"{sub.name}/: cannot read: {exc.strerror}")
        found = scan(entries, folders)
    except OSError as exc:
        return Found(problems=[f"cannot read {folder}: {exc.strerror}"])
    found.skipped.extend(unreadable)
    for why in found.skipped:
        log.warning("models_dir %s: passed over %s", folder, why)
    return found


def fingerprint(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and mtime of each `*.gguf` in the folder and its subfolders: a reload
    waits until this stops changing, as it does for the config file, so a file being copied
    in is not read half-written. An unreadable folder has an empty fingerprint (the scan
    reports it)."""
    try:
        out = _stats(folder, "")
        for sub in subfolders(folder):
            try:
                out += _stats(sub, sub.name + "/")
            except OSError:
                continue
    except OSError:
        return ()
    return tuple(sorted(out))


def _stats(folder: Path, prefix: str) -> list[tuple[str, int, int]]:
    out = []
    for p in folder.iterdir():
        if is_candidate(p.name):
            try:
                st = p.stat()
            except OSError:  # removed (or a broken link) between listing and stat
                continue
            out.append((prefix + p.name, st.st_size, st.st_mtime_ns))
    return out


def add_tables(raw: dict[str, object], base_dir: Path) -> list[str]:
    """Give parsed TOML, before its type check, a `[models.NAME]` table for each model
    of its `[server] models_dir` (relative to `base_dir`), so that a folder's models are
    checked and resolved as written ones are. A table of the same name is the override:
    it keeps every key it sets, and takes the file as its `path` if it sets none. A model
    whose name is a table's alias is left to the table. Returns problems as
    `key.path: message`; a value of the wrong type is left for the type check."""
    server = raw.get("server")
    value = server.get("models_dir") if isinstance(server, dict) else None
    tables = raw.setdefault("models", {})
    if not isinstance(value, str) or not isinstance(tables, dict):
        return []
    folder = (base_dir / os.path.expanduser(value)).resolve()
    found = found_in(folder)
    problems = [f"server.models_dir: {p}" for p in found.problems]
    aliases = {
        a: name
        for name, t in tables.items()
        if isinstance(t, dict) and isinstance(t.get("aliases"), list)
        for a in t["aliases"]
        if isinstance(a, str)
    }
    for name, (file, _) in found.not_ready.items():
        table = tables.get(name)
        if isinstance(table, dict) and "path" not in table:
            # Its table asks for it by name: the check of its path says why the file
            # cannot be had, rather than that the table lacks a path. The reload fails
            # and the old config keeps serving.
            table["path"] = str(folder / file)
    for name, file in found.models.items():
        path = str(folder / file)
        table = tables.get(name)
        projector = found.projectors.get(name)
        if isinstance(table, dict):
            table.setdefault("path", path)
            if projector is not None:
                table.setdefault("mmproj", str(folder / projector))
        elif name in aliases:
            log.info("models_dir %s: %s is not served as %r, an alias of models.%s", folder, file, name, aliases[name])
        elif table is None:
            tables[name] = {"path": path} if projector is None else {"path": path, "mmproj": str(folder / projector)}
    if not tables and not problems:
        problems.append(f"server.models_dir: no *.gguf model in {folder}")
    return problems

"""The layout, read from the source (issue 21): imports go one way between the packages,
no module imports itself back through others, and no module is over 400 lines.

The packages and who may import whom:
  corral (the command line) -> router (the HTTP server) -> supervisor -> worker.protocol
and `worker` imports none of the others. Only `worker` imports llama_cpp: the router and the
supervisor never load the library (docs/architecture.md, "Processes and imports").
Every import counts, the ones under `if TYPE_CHECKING:` too: a reader follows them all.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("corral", "router", "supervisor", "worker")
# What each package may import of the others. The supervisor speaks to workers through
# worker.protocol (frames, specs) and worker.log_format (the log lines it relays), nothing
# else; the router also reads worker.chat_formats, the markers of the tool-call and reasoning
# formats that the worker's templates write and the router parses back (stdlib only).
ALLOWED: dict[str, tuple[str, ...]] = {
    "corral": ("router", "supervisor", "worker"),
    "router": ("supervisor", "worker.protocol", "worker.log_format", "worker.chat_formats"),
    "supervisor": ("worker.protocol", "worker.log_format"),
    "worker": (),
}
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the four packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The first-party modules `name` imports (a package's __init__ when that is all it
    names), and the third-party top-level names, prefixed with '!'."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import mod` names a module; `from mod import thing` names mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                out.add(target)
            else:
                out.add("!" + target.split(".")[0])
    out.discard(name)
    return out


@functools.cache  # the source does not change during a run; parsed once for every test
def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_circles_and_reads_every_kind_of_import(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "x.py"
    source.write_text(
        "from . import rejected\n"
        "from .request import Request\n"
        "from worker.protocol import ErrorCode\n"
        "import llama_cpp.llama_cpp\n"
        "if TYPE_CHECKING:\n"
        "    from worker.constraint import Matcher\n"
    )
    known = {"worker", "worker.x", "worker.rejected", "worker.request", "worker.protocol", "worker.constraint"}
    assert imports_of("worker.x", source, known) == {
        "worker.rejected", "worker.request", "worker.protocol", "worker.constraint", "!llama_cpp",
    }


def test_no_import_circle_anywhere() -> None:
    assert cycles(graph()) == []


def test_packages_import_one_way() -> None:
    wrong = []
    for name, targets in graph().items():
        package = name.split(".")[0]
        for target in targets:
            if target.startswith("!") or target.split(".")[0] == package:
                continue
            if not any(target == a or target.startswith(a + ".") for a in ALLOWED[package]):
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_only_the_worker_loads_llama_cpp() -> None:
    loaders = sorted(n for n, targets in graph().items() if "!llama_cpp" in targets)
    assert loaders and all(n.startswith("worker.") for n in loaders), loaders


def test_the_wire_contract_needs_only_the_standard_library_and_msgspec() -> None:
    """The supervisor and the router import worker.protocol: anything it pulled in, they
    would load too."""
    extra = {
        f"{n} imports {t[1:]}"
        for n, targets in graph().items() if n.startswith("worker.protocol")
        for t in targets
        if t.startswith("!") and t[1:] not in sys.stdlib_module_names and t[1:] not in ("msgspec", "__future__")
    }
    first_party = {f"{n} imports {t}" for n, targets in graph().items() if n.startswith("worker.protocol")
                   for t in targets if not t.startswith("!") and not t.startswith("worker.protocol")}
    assert extra | first_party == set()


def test_nothing_imports_the_command_line() -> None:
    users = sorted(n for n, targets in graph().items()
                   if not n.startswith("corral") and any(t.startswith("corral") for t in targets))
    assert users == []


# Inside the router: the server's plumbing knows no generation and no dialect; the
# generation logic knows no dialect; a dialect knows no other, except that llama-server's
# own routes take OpenAI's chat shapes (as llama-server's do) and read them with openai/'s
# decoders. The choice among a model's replicas elsewhere (upstream/) is plumbing too: it
# knows no generation and no dialect.
ROUTER_LAYERS: dict[str, tuple[str, ...]] = {
    "router.server": ("router.generation", "router.api", "router.app"),
    "router.upstream": ("router.generation", "router.api", "router.app"),
    # The usage ledger and quotas sit beside the server's parts: they read the access log's
    # records and the keys, and no dialect or generation code.
    "router.usage": ("router.generation", "router.api", "router.app", "router.upstream"),
    "router.generation": ("router.api", "router.app"),
    "router.api": ("router.app",),
}
# llama-server's routes and OpenAI's Responses API answer errors in OpenAI's shape, so they
# may use OpenAI's error envelope and schemas.
DIALECT_MAY_IMPORT = {"router.api.llama": ("router.api.openai",), "router.api.responses": ("router.api.openai",)}


def dialects() -> list[str]:
    return sorted(
        f"router.api.{p.name}" for p in (ROOT / "router" / "api").iterdir() if (p / "__init__.py").is_file()
    )


def test_the_router_shows_the_server_the_generation_the_upstreams_and_a_folder_per_dialect() -> None:
    router = ROOT / "router"
    folders = sorted(p.name for p in router.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == ["api", "generation", "server", "upstream", "usage"]
    assert sorted(p.name for p in router.glob("*.py")) == ["__init__.py", "app.py"]
    assert {"router.api.openai", "router.api.llama"} <= set(dialects())


def test_router_layers_import_inward_only() -> None:
    wrong = []
    for name, targets in graph().items():
        for layer, banned in ROUTER_LAYERS.items():
            if name == layer or name.startswith(layer + "."):
                wrong += [f"{name} imports {t}" for t in targets if any(t == b or t.startswith(b + ".") for b in banned)]
    assert wrong == []


def test_a_dialect_imports_no_other_dialect() -> None:
    folders = dialects()
    wrong = []
    for name, targets in graph().items():
        own = next((d for d in folders if name == d or name.startswith(d + ".")), None)
        if own is None:
            continue
        for t in targets:
            other = next((d for d in folders if t == d or t.startswith(d + ".")), None)
            if other is not None and other != own and other not in DIALECT_MAY_IMPORT.get(own, ()):
                wrong.append(f"{name} imports {t}")
    assert wrong == []


def test_every_dialect_has_the_same_rooms() -> None:
    """A newcomer who knows one dialect's folder finds their way in the next."""
    rooms = {"__init__.py", "schemas.py", "translate.py", "render.py", "errors.py", "routes.py"}
    missing = {
        d: sorted(rooms - {p.name for p in (ROOT / d.replace(".", "/")).glob("*.py")}) for d in dialects()
    }
    assert {d: m for d, m in missing.items() if m} == {}


def test_every_dialect_is_served() -> None:
    """A dialect's folder exports its DIALECT, and the app registers it."""
    from router import app

    served = {d.name for d in app.DIALECTS}
    assert served == {d.rpartition(".")[2] for d in dialects()}


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_stay_small(package: str) -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / package).rglob("*.py")
    }
    assert sizes, f"no modules found under {package}/"
    too_big = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert too_big == {}, f"over {MAX_LINES} lines: split where the module holds two things"


def test_unit_tests_mirror_the_packages() -> None:
    """tests/unit/worker/test_slots.py tests worker/slots.py: a newcomer finds a module's
    tests by its path. Every folder of tests/unit is a package folder of the source."""
    unit = ROOT / "tests" / "unit"
    folders = [p.relative_to(unit) for p in unit.rglob("*") if p.is_dir() and p.name != "__pycache__"]
    assert folders, "tests/unit has no package folders"
    strays = [str(f) for f in folders if not (ROOT / f / "__init__.py").is_file()]
    assert strays == []
    loose = sorted(p.name for p in unit.glob("test_*.py"))
    assert loose == ["test_behaviour.py", "test_layout.py"], "a module's tests go under its package's folder"


def test_every_source_path_that_the_docs_and_comments_name_exists() -> None:
    """After a move, a comment or a doc that still names the old path sends a reader to
    nothing: README, docs/ and every module of the packages and the tests."""
    pattern = re.compile(r"\b(?:corral|router|supervisor|worker|tests)/[A-Za-z0-9_/]+\.py\b")
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    texts += [p for package in (*PACKAGES, "tests") for p in (ROOT / package).rglob("*.py")]
    missing = sorted({
        f"{t.relative_to(ROOT)} names {m}"
        for t in texts
        for m in pattern.findall(t.read_text())
        if not (ROOT / m).exists()
    })
    assert missing == []


# The docs: a short README that sends readers to docs/, an index there that names every page,
# and no relative link that leads nowhere (issue "The first hour: a short front door").
README_MAX_LINES = 300
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def doc_pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def prose(text: str) -> str:
    """The text with fenced code blocks and code spans blanked: a link shown as code is not
    one. A code span may run over a line break, never over a paragraph's end."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        out.append("" if fenced or FENCE.match(line) else line)
    paragraphs = re.split(r"\n\s*\n", "\n".join(out))
    return "\n\n".join(re.sub(r"`[^`]*`", "", p) for p in paragraphs)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, every character that is not a letter, a
    digit, a space, '-' or '_' dropped, spaces made '-'. Inline code keeps its text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of a Markdown file give, duplicates numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    lines, fenced = path.read_text().splitlines(), False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = github_slug(m[1])
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(prose(path.read_text()))
    return [t for t in targets if not re.match(r"^(?:[a-z][a-z0-9+.-]*:|//)", t, re.I)]


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(ROOT)}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading of {dest.name} gives #{anchor}")
    return problems


def test_the_slugs_are_githubs() -> None:
    assert github_slug("Coding agents: Anthropic's Messages API and OpenAI's Responses API") == (
        "coding-agents-anthropics-messages-api-and-openais-responses-api")
    assert github_slug("The internal request: `GenerationJob`") == "the-internal-request-generationjob"
    assert github_slug("1. Install") == "1-install"
    assert github_slug("n_ctx and `max_tokens`") == "n_ctx-and-max_tokens"


def test_the_link_checker_finds_a_broken_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# A\n\n## Two words\n\n## Two words\n\n```\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md) [ok](a.md#two-words-1) [ok](#b) [web](https://x.example/none) `[code](nowhere.md)`\n"
        "[gone](c.md) [bad anchor](a.md#two-words-2) [not a heading](a.md#not-a-heading)\n\n# B\n"
    )
    assert broken_links(tmp_path / "b.md") == [
        "b.md: c.md: no such file",
        "b.md: a.md#two-words-2: no heading of a.md gives #two-words-2",
        "b.md: a.md#not-a-heading: no heading of a.md gives #not-a-heading",
    ]


def test_the_readme_is_a_short_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, over {README_MAX_LINES}: the reference goes in docs/")
    assert "docs/README.md" in relative_links(ROOT / "README.md"), "README.md should link docs/README.md"


def test_the_docs_index_links_every_page() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in relative_links(index)}
    missing = [str(p.relative_to(ROOT)) for p in doc_pages() if p != index and p.resolve() not in linked]
    assert missing == [], "docs/README.md (the index) should link every page"


def test_every_relative_link_in_the_docs_leads_somewhere() -> None:
    problems = [p for path in [ROOT / "README.md", *doc_pages()] for p in broken_links(path)]
    assert problems == []

"""The one registry of codes (``executor/codes.py``): the docs list it exactly, the code base
raises only what it holds, and nothing it holds is dead.

The AST scan reads every module of ``executor/`` (the synthetic provider in ``tools/`` speaks
its own provider's vocabulary and is left out, and ``executor/client`` is ``agentsafe.client``,
which imports nothing of the server). A code goes where a code goes: the ``code=``
argument, a class's ``code`` attribute, a ``"code"`` field, the first argument of an error or a
refusal. In any of those places a bare string literal is refused; the registry member is used.

The reason codes a verdict carries are held the same way: in a reason position (the
``reason_code``/``reason_codes`` argument or field, the reason argument of the authority's and the
seam's answer builders) a bare string literal is refused, and every member found there is in
:data:`~agentsafe.executor.codes.REASON_CODES`. A policy author's own reason codes come from the
policy file as data, never as literals, so the scan leaves them alone. Nowhere in ``executor/``
is a registered code spelled as a string literal, except where another vocabulary shares its
name: a StrEnum member named for itself, an event name, a posture check name.

Regenerate the docs table after changing the registry:
``AGENTSAFE_WRITE_ERROR_CODES=1 .venv/bin/pytest tests/test_codes.py``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
from pathlib import Path

import pytest

import agentsafe.executor
from agentsafe.executor import errors
from agentsafe.executor.codes import HOST_CODE_STATUS, REASON_CODES, Code
from agentsafe.executor.errors import AgentSafeError
from agentsafe.executor.routes.refusals import code_for_http_error, status_of

REPO = Path(__file__).resolve().parent.parent
EXECUTOR = REPO / "executor"
DOC = REPO / "docs" / "error-codes.md"
BEGIN = "<!-- BEGIN error codes: generated from executor/codes.py by tests/test_codes.py -->"
END = "<!-- END error codes -->"

_OWN_VOCABULARY = {  # the fake providers' own codes
    EXECUTOR / "tools" / "synthetic.py",
    EXECUTOR / "tools" / "synthetic_credentials.py",
    EXECUTOR / "tools" / "synthetic_bank.py",
}
# Not a code: the plan routes' evidence event says "OK" for a success.
_NOT_CODES = {("executor/routes/plans.py", "OK")}
# Callables whose first argument is the code (the rest take a message first and ``code=``).
_CODE_FIRST = {
    "RequestRejected",
    "JwtRefused",
    "GrantRefused",
    "PrincipalsFileError",
    "SignatureError",
    "TransportError",
    "GuardRefused",
    "_Refused",
    "_Refusal",
    "_ReadRefused",
    "error_body",
    "refusal",
}


# Callables whose second argument is a reason code, or a sequence of them.
_REASON_SECOND = {"_answer", "_allow", "_report", "_code_of", "_failed_before_dispatch"}
_REASON_NAMES = {"reason_code", "reason_codes"}
# Posture check names: a vocabulary of its own, some named for the code they refuse with.
_CHECK_NAMES = {EXECUTOR / "host" / "posture.py"}


CLIENT = EXECUTOR / "client"
"""``agentsafe.client`` (its own package, no server imports): it reads codes off the wire as
text, and its exceptions have their own root (``AgentSafeClientError``)."""


def _modules() -> list[tuple[Path, ast.Module]]:
    out = []
    # The operator raises and logs registry codes too (its start-up refusals).
    for path in sorted([*EXECUTOR.rglob("*.py"), *(EXECUTOR.parent / "operator").rglob("*.py")]):
        if (path.name == "codes.py" and path.parent == EXECUTOR) or path in _OWN_VOCABULARY:
            continue
        if CLIENT in path.parents:  # agentsafe.client: its own package, reads the wire's codes
            continue
        out.append((path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))))
    return out


def _callee(call: ast.Call) -> str:
    fn = call.func
    if isinstance(fn, ast.Attribute):
        return fn.attr
    return fn.id if isinstance(fn, ast.Name) else ""


def _is_text(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant | ast.JoinedStr) and not (
        isinstance(node, ast.Constant) and not isinstance(node.value, str)
    )


def _code_positions(tree: ast.Module) -> list[ast.expr]:
    """Every expression that stands where a code goes."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += [kw.value for kw in node.keywords if kw.arg == "code"]
            if node.args and _callee(node) in _CODE_FIRST:
                found.append(node.args[0])
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target = stmt.targets[0]
                value = getattr(stmt, "value", None)
                if isinstance(target, ast.Name) and target.id == "code" and value is not None:
                    found.append(value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    found.append(value)
    return found


def _flat(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [leaf for item in node.elts for leaf in _flat(item)]
    if isinstance(node, ast.Starred):
        return _flat(node.value)
    return [node]


def _reason_positions(tree: ast.Module) -> list[ast.expr]:
    """Every expression that stands where a verdict's reason code goes."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += [kw.value for kw in node.keywords if kw.arg in _REASON_NAMES]
            if len(node.args) > 1 and _callee(node) in _REASON_SECOND:
                found.append(node.args[1])
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in _REASON_NAMES:
                    found.append(value)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = list(
                zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
            )
            pairs += [
                (a, d)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if d is not None
            ]
            found += [default for arg, default in pairs if arg.arg in _REASON_NAMES]
    return [leaf for node in found for leaf in _flat(node)]


def _other_vocabulary(tree: ast.Module) -> set[int]:
    """The string constants that are not codes although they may spell one: docstrings, event
    names (``emit``'s first argument) and StrEnum members named for themselves."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.Call) and _callee(node) == "emit" and node.args:
            skip |= {id(name) for name in ast.walk(node.args[0])}
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Constant)
                    and stmt.value.value == stmt.targets[0].id
                ):
                    skip.add(id(stmt.value))
    return skip


def _code_references(tree: ast.Module) -> set[str]:
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Code"
        and not node.attr.startswith("_")
    }


def _docs_table() -> str:
    rows = ["| code | HTTP | appears as | meaning |", "| --- | --- | --- | --- |"]
    for code in Code:
        status = str(code.status) if code.status is not None else "—"
        where = [
            w for w, yes in (("refusal", code.status), ("reason", code in REASON_CODES)) if yes
        ]
        rows.append(
            f"| `{code.value}` | {status} | {', '.join(where) or 'error'} | {code.meaning} |"
        )
    return "\n".join(rows)


# ---------------------------------------------------------------------- the registry itself


def test_every_member_is_its_own_name_with_a_status_and_one_line_meaning() -> None:
    assert len(Code) > 200
    for code in Code:
        assert code.value == code.name
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", code.value)
        assert code.status is None or 400 <= code.status <= 599, code
        assert code.meaning, code
        assert len(code.meaning) <= 100, code
        assert code.meaning == code.meaning.strip(), code
        assert not code.meaning.endswith("."), code
        assert not set(code.meaning) & {"\n", "|"}, code


def test_the_edge_maps_a_code_to_the_registry_status() -> None:
    assert status_of(Code.IDEMPOTENCY_IN_PROGRESS) == 409
    assert status_of("IDEMPOTENCY_IN_PROGRESS") == 409
    assert status_of(Code.APPROVAL_EXPIRED) == 409  # one status, on every route
    assert status_of(Code.REQUEST_TOO_LARGE) == 413  # the body limit and the JSON bounds
    assert status_of("A_HOST_EXECUTORS_OWN_CODE") == HOST_CODE_STATUS == 422
    assert code_for_http_error(404) is Code.NOT_FOUND
    assert code_for_http_error(431) is Code.REQUEST_REFUSED


# ---------------------------------------------------------------------- the docs


def test_the_docs_list_every_code_exactly() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text, f"{DOC} lost its generated-table markers"
    assert END in text, f"{DOC} lost its generated-table markers"
    head, rest = text.split(BEGIN, 1)
    table, tail = rest.split(END, 1)
    expected = _docs_table()
    if os.environ.get("AGENTSAFE_WRITE_ERROR_CODES") == "1":
        DOC.write_text(f"{head}{BEGIN}\n{expected}\n{END}{tail}", encoding="utf-8")
        table = f"\n{expected}\n"
    assert table.strip() == expected, (
        "docs/error-codes.md differs from executor/codes.py; regenerate it with "
        "AGENTSAFE_WRITE_ERROR_CODES=1 .venv/bin/pytest tests/test_codes.py"
    )


# ---------------------------------------------------------------------- the code base


def test_no_code_is_a_bare_string_where_a_code_goes() -> None:
    bare = [
        f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in _modules()
        for node in _code_positions(tree)
        if _is_text(node)
        and (str(path.relative_to(REPO)), getattr(node, "value", None)) not in _NOT_CODES
    ]
    assert bare == [], "raise by registry member (Code.X), not by string:\n" + "\n".join(bare)


def _member_prefixed(node: ast.expr) -> bool:
    """``f"{Code.LOOKUP_STATUS}_{status}"``: a registered prefix with a detail after it."""
    if not (isinstance(node, ast.JoinedStr) and node.values):
        return False
    head = node.values[0]
    return (
        isinstance(head, ast.FormattedValue)
        and isinstance(head.value, ast.Attribute)
        and isinstance(head.value.value, ast.Name)
        and head.value.value.id == "Code"
    )


def test_no_reason_code_is_a_bare_string_where_a_reason_code_goes() -> None:
    bare = [
        f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in _modules()
        for node in _reason_positions(tree)
        if _is_text(node) and not _member_prefixed(node)
    ]
    assert bare == [], "emit a reason by registry member (Code.X):\n" + "\n".join(bare)


def test_every_reason_code_the_executor_emits_is_a_registered_reason_code() -> None:
    emitted = {
        node.attr
        for _path, tree in _modules()
        for position in _reason_positions(tree)
        for node in ast.walk(position)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Code"
    }
    assert emitted, "the reason-position scan found nothing; it lost track of the code base"
    assert sorted(emitted - {code.name for code in REASON_CODES}) == []


def test_no_registered_code_is_spelled_as_a_string_literal() -> None:
    spelled = []
    for path, tree in _modules():
        if path in _CHECK_NAMES:
            continue
        skip = _other_vocabulary(tree)
        spelled += [
            f"{path.relative_to(REPO)}:{node.lineno}: {node.value}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in Code.__members__
            and id(node) not in skip
        ]
    assert spelled == [], "use the registry member (Code.X):\n" + "\n".join(spelled)


def test_every_code_the_code_base_names_is_in_the_registry_and_none_is_dead() -> None:
    used: set[str] = set()
    for _path, tree in _modules():
        used |= _code_references(tree)
    unknown = sorted(used - set(Code.__members__))
    assert unknown == []
    dead = sorted(set(Code.__members__) - used)
    assert dead == [], f"registered but never used: {dead}"


def test_every_code_refused_over_http_has_a_status() -> None:
    refusers = {"RequestRejected", "refusal", "_refuse", "_Refusal"}
    missing = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _callee(node) in refusers and node.args):
                continue
            first = node.args[0]
            if (
                path.name not in ("guard.py", "urls.py")  # egress _Refusal: outbound, not HTTP
                and isinstance(first, ast.Attribute)
                and isinstance(first.value, ast.Name)
                and first.value.id == "Code"
                and Code[first.attr].status is None
            ):
                missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {first.attr}")
    assert missing == []


# ---------------------------------------------------------------------- the hierarchy


def _executor_exceptions() -> list[type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(agentsafe.executor.__path__, "agentsafe.executor."):
        if ".tools." in info.name:  # dev tools: never inside agentsafe serve
            continue
        if info.name.startswith("agentsafe.executor.client"):  # agentsafe.client: its own root
            continue
        module = importlib.import_module(info.name)
        for _name, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return list(classes.values())


@pytest.fixture(scope="module")
def exceptions() -> list[type[BaseException]]:
    return _executor_exceptions()


def test_one_root_every_public_error_with_a_registry_code(
    exceptions: list[type[BaseException]],
) -> None:
    for cls in exceptions:
        if cls.__name__.startswith("_"):
            continue  # private control flow, turned into a public error before it leaves
        assert issubclass(cls, AgentSafeError), f"{cls.__qualname__} is outside the one root"
        assert cls.code in Code.__members__, cls
        assert type(cls.code) is Code, cls


def test_the_hierarchy_docstring_names_every_error(
    exceptions: list[type[BaseException]],
) -> None:
    doc = errors.__doc__ or ""
    named = set(re.findall(r"[├└]── (\w+)", doc)) | {"AgentSafeError"}
    public = {cls.__name__ for cls in exceptions if not cls.__name__.startswith("_")}
    assert public - named == set(), "errors.py's hierarchy docstring misses some"
    assert named - public == set(), "errors.py's hierarchy docstring names a class that is gone"

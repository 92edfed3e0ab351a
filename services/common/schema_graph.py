"""The shape of a JSON schema as the grammar engine walks it: how many subschemas, how many
enum and const values, and how deep it nests once every `$ref` is followed.

Why the depth follows references: llguidance recurses into a referenced definition as into a
nested one, so a chain of a few thousand `$defs` that refer to each other (under 200 KB) overflows
its stack and kills the process (SIGSEGV), while its own nesting check only sees the text.

The depth is an upper bound that holds for any traversal order: containers (objects and
arrays) are nodes, nesting and references are edges, each strongly connected set (a recursive
definition) counts as deep as its size, and the longest path through the condensed graph is the
depth. Linear in the document's size; no recursion (a deep document cannot overflow it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose value is a regex (patternProperties: its keys are).
_PATTERN_KEYS = ("pattern",)
# minLength, maxItems and the like are not counted: llguidance 1.9.1 compiles and masks a
# maxLength of 100,000 or a minItems of 10,000 in milliseconds.


@dataclass(slots=True)
class SchemaShape:
    schemas: int = 0  # objects in the document (each a subschema or a keyword's object)
    values: int = 0  # enum and const values
    depth: int = 0  # containers deep, following references (an upper bound)
    patterns: list[str] = field(default_factory=list)  # every regex the schema holds


def schema_shape(document: Any) -> SchemaShape:
    """The shape of a parsed JSON schema (any JSON value)."""
    nodes, children = _containers(document)
    shape = SchemaShape()
    anchors: dict[str, int] = {}
    ids: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if isinstance(node, dict):
            _measure(node, shape)
            if isinstance(node.get("$anchor"), str):
                anchors[node["$anchor"]] = i
            if isinstance(node.get("$id"), str):
                ids[node["$id"].rstrip("#")] = i
    index = {id(node): i for i, node in enumerate(nodes)}
    named = sorted(set(anchors.values()) | set(ids.values()))
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            continue
        for key in _REF_KEYS:
            ref = node.get(key)
            if isinstance(ref, str):
                target = _resolve(ref, document, anchors, ids, index)
                # Unresolved: whatever it may name, assume the worst.
                children[i].extend([target] if target is not None else named)
    shape.depth = _longest_path(children)
    return shape


def nesting_depth(document: Any) -> int:
    """Objects and arrays nested in a parsed JSON value, without following references;
    iterative, so that a deep document cannot overflow the stack measuring it."""
    deepest = 0
    pending = [(document, 1)] if isinstance(document, dict | list) else []
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        values = node.values() if isinstance(node, dict) else node
        pending.extend((v, depth + 1) for v in values if isinstance(v, dict | list))
    return deepest


def _measure(node: dict, shape: SchemaShape) -> None:
    shape.schemas += 1
    if isinstance(node.get("enum"), list):
        shape.values += len(node["enum"])
    if "const" in node:
        shape.values += 1
    for key in _PATTERN_KEYS:
        if isinstance(node.get(key), str):
            shape.patterns.append(node[key])
    if isinstance(node.get("patternProperties"), dict):
        shape.patterns.extend(node["patternProperties"])


def _containers(document: Any) -> tuple[list[Any], list[list[int]]]:
    """Every dict and list of the document (node 0 is the root, when it is one) and, for each,
    the indices of the containers directly inside it."""
    nodes: list[Any] = []
    children: list[list[int]] = []
    if not isinstance(document, dict | list):
        return [None], [[]]
    pending = [(document, -1)]
    while pending:
        node, parent = pending.pop()
        nodes.append(node)
        children.append([])
        if parent >= 0:
            children[parent].append(len(nodes) - 1)
        values = node.values() if isinstance(node, dict) else node
        me = len(nodes) - 1
        pending.extend((v, me) for v in values if isinstance(v, dict | list))
    return nodes, children


def _resolve(
    ref: str, root: Any, anchors: dict[str, int], ids: dict[str, int], index: dict[int, int]
) -> int | None:
    base, _, fragment = ref.partition("#")
    if base:
        start = ids.get(base)
        if start is None:
            return None
        if not fragment:
            return start
        return None  # a pointer inside another resource: not followed here
    if not fragment:
        return 0
    if not fragment.startswith("/"):
        return anchors.get(fragment)
    node = root
    for token in fragment[1:].split("/"):
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return index.get(id(node))


def _longest_path(children: list[list[int]]) -> int:
    """The most nodes on a path from node 0, a strongly connected set counting as its size."""
    component, members = _components(children)
    # Tarjan numbers components in reverse topological order: successors come first.
    depth = [0] * len(members)
    for c, nodes in enumerate(members):
        below = 0
        for v in nodes:
            for w in children[v]:
                if component[w] != c:
                    below = max(below, depth[component[w]])
        depth[c] = len(nodes) + below
    return depth[component[0]] if children else 0


def _components(children: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Tarjan's strongly connected components, iterative: each node's component, and each
    component's nodes (successor components before the components that reach them)."""
    n = len(children)
    order = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    component = [-1] * n
    members: list[list[int]] = []
    stack: list[int] = []
    counter = 0
    for start in range(n):
        if order[start] >= 0:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                order[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            elif i > 0:
                low[v] = min(low[v], low[children[v][i - 1]])
            while i < len(children[v]):
                w = children[v][i]
                i += 1
                if order[w] < 0:
                    work.append((v, i))
                    work.append((w, 0))
                    break
                if on_stack[w]:
                    low[v] = min(low[v], order[w])
            else:
                if low[v] == order[v]:
                    nodes = []
                    while True:
                        w = stack.pop()
                        on_stack[w] = False
                        component[w] = len(members)
                        nodes.append(w)
                        if w == v:
                            break
                    members.append(nodes)
    return component, members

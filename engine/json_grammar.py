"""A character-level pushdown recognizer for JSON text, with schema state.

A state is an immutable stack (a tuple) of frames, each a small tuple whose first item is
its tag; ``step(state, ch)`` returns the next state, or None when ``ch`` cannot follow.
States are hashable and compare by value (schema nodes by identity), so callers can
intern them and cache per-state results.

Frames (tag, fields):

- ``END``  (done,): the bottom; ``done`` once the root value ended (then only
  whitespace may follow).
- ``VALUE`` (node,): a value of schema ``node`` starts here (after any whitespace).
- ``OBJ`` (spec, seen, phase, pending): inside an object; ``seen`` holds the keys
  written so far, ``pending`` the schema of the value after the current key.
- ``ARR`` (items, phase): inside an array.
- ``STR`` (esc): inside a string whose content is free (a string value, or a key of an
  object that takes any key); ``esc`` 0 plain, -1 after a backslash, k > 0 hex digits left.
- ``KEY`` (candidates, typed, open): inside a key that must be one of ``candidates``
  (encoded names); ``open`` objects may turn it into a free key.
- ``NUM`` (phase, integer_only): inside a number.
- ``LIT`` (choices, typed): a literal (true, false, null, enum/const texts).

Nesting is capped at ``MAX_DEPTH`` containers, which bounds what a looping model can do
without refusing real-world JSON. Whitespace between tokens is unlimited here (any amount
is valid JSON and leaves the state unchanged, so it adds no states); the token masks cap
whitespace runs at ``MAX_WS`` characters (``engine.constraint_index``). ``structural``
tells whether whitespace next would be such a run.
"""

from __future__ import annotations

from typing import Any

from engine.json_schema import Node

__all__ = ["MAX_DEPTH", "MAX_WS", "State", "closed", "complete", "initial", "step",
           "structural"]

State = tuple[tuple[Any, ...], ...]

MAX_WS = 32
MAX_DEPTH = 20

END, VALUE, OBJ, ARR, STR, KEY, NUM, LIT = range(8)
# object phases
O_START, O_KEY, O_COLON, O_VALUE, O_AFTER, O_NEXT = range(6)
# array phases
A_START, A_VALUE, A_AFTER, A_NEXT = range(4)
# number phases
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGIT = range(8)
_N_ACCEPTING = frozenset({N_ZERO, N_INT, N_FRAC, N_EXP_DIGIT})

WS = frozenset(" \t\n\r")
DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrt')
_STRUCTURAL = frozenset({END, VALUE, OBJ, ARR, NUM})
_BOOLEANS = ("true", "false")
_NULL = ("null",)


def initial(root: Node) -> State:
    return ((END, False), (VALUE, root))


def _depth(stack: State) -> int:
    return sum(1 for frame in stack if frame[0] == OBJ or frame[0] == ARR)


def _done(stack: State) -> State:
    """``stack``'s top value just ended: advance its parent."""
    parent = stack[-1]
    tag = parent[0]
    if tag == OBJ:
        return stack[:-1] + ((OBJ, parent[1], parent[2], O_AFTER, None),)
    if tag == ARR:
        return stack[:-1] + ((ARR, parent[1], A_AFTER),)
    assert tag == END, parent
    return stack[:-1] + ((END, True),)


def _start_value(below: State, node: Node, ch: str) -> State | None:
    """The first character of a value of ``node`` (``below`` is the stack under it)."""
    if node.literals is not None:
        return _literal(below + ((LIT, node.literals, ""),), node.literals, "", ch)
    if ch == '"':
        return below + ((STR, 0),) if node.string else None
    if ch == "{" or ch == "[":
        if _depth(below) >= MAX_DEPTH:
            return None
        if ch == "{":
            return below + ((OBJ, node.obj, frozenset(), O_START, None),) \
                if node.obj is not None else None
        return below + ((ARR, node.items, A_START),) if node.items is not None else None
    if ch == "-" or ch in DIGITS:
        if not (node.number or node.integer):
            return None
        phase = N_MINUS if ch == "-" else N_ZERO if ch == "0" else N_INT
        return below + ((NUM, phase, not node.number),)
    if node.boolean and (ch == "t" or ch == "f"):
        return _literal(below + ((LIT, _BOOLEANS, ""),), _BOOLEANS, "", ch)
    if node.null and ch == "n":
        return _literal(below + ((LIT, _NULL, ""),), _NULL, "", ch)
    return None


def _literal(stack: State, choices: tuple[str, ...], typed: str, ch: str) -> State | None:
    longer = typed + ch
    left = tuple(c for c in choices if c.startswith(longer))
    if left:
        if left == (longer,):  # nothing can extend it: the value is over
            return _done(stack[:-1])
        return stack[:-1] + ((LIT, left, longer),)
    if typed in choices:  # a complete literal (a number enum) ended by a terminator
        return step(_done(stack[:-1]), ch)
    return None


def _number(stack: State, phase: int, integer_only: bool, ch: str) -> State | None:
    nxt = -1
    if ch in DIGITS:
        if phase == N_MINUS:
            nxt = N_ZERO if ch == "0" else N_INT
        elif phase in (N_INT, N_FRAC, N_EXP_DIGIT):
            nxt = phase
        elif phase == N_DOT:
            nxt = N_FRAC
        elif phase in (N_EXP, N_EXP_SIGN):
            nxt = N_EXP_DIGIT
    elif ch == "." and not integer_only and phase in (N_ZERO, N_INT):
        nxt = N_DOT
    elif (ch == "e" or ch == "E") and not integer_only and phase in (N_ZERO, N_INT, N_FRAC):
        nxt = N_EXP
    elif (ch == "+" or ch == "-") and phase == N_EXP:
        nxt = N_EXP_SIGN
    if nxt >= 0:
        return stack[:-1] + ((NUM, nxt, integer_only),)
    if phase in _N_ACCEPTING:
        return step(_done(stack[:-1]), ch)
    return None


def _close_key(stack: State, encoded: str | None) -> State:
    """A key ended: ``encoded`` is a listed property, None a free key."""
    below = stack[:-1]
    parent = below[-1]
    spec = parent[1]
    if encoded is None:
        return below[:-1] + ((OBJ, spec, parent[2], O_COLON, spec.additional),)
    return below[:-1] + ((OBJ, spec, parent[2] | {encoded}, O_COLON,
                          spec.properties[encoded]),)


def _string(stack: State, esc: int, ch: str) -> State | None:
    if esc == 0:
        if ch == '"':
            parent = stack[-2]
            if parent[0] == OBJ and parent[3] == O_KEY:
                return _close_key(stack, None)
            return _done(stack[:-1])
        if ch == "\\":
            return stack[:-1] + ((STR, -1),)
        return None if ch < " " else stack
    if esc == -1:
        if ch in _ESCAPES:
            return stack[:-1] + ((STR, 0),)
        return stack[:-1] + ((STR, 4),) if ch == "u" else None
    return stack[:-1] + ((STR, esc - 1),) if ch in _HEX else None


def _escape_state(text: str) -> int:
    """The ``STR`` escape state after ``text`` (a valid prefix of a string body)."""
    esc = 0
    for ch in text:
        esc = (-1 if ch == "\\" else 0) if esc == 0 else \
            (4 if ch == "u" else 0) if esc == -1 else esc - 1
    return esc


def _key(stack: State, frame: tuple[Any, ...], ch: str) -> State | None:
    candidates, typed, is_open = frame[1], frame[2], frame[3]
    longer = typed + ch
    left = tuple(c for c in candidates if c.startswith(longer))
    if left:
        return stack[:-1] + ((KEY, left, longer, is_open),)
    if ch == '"' and typed in candidates:
        return _close_key(stack, typed)
    if is_open:  # not a listed name: a free key
        return _string(stack[:-1] + ((STR, _escape_state(typed)),), _escape_state(typed), ch)
    return None


def _open_key(stack: State, frame: tuple[Any, ...]) -> State | None:
    spec, seen = frame[1], frame[2]
    names = tuple(n for n in spec.names if n not in seen)
    is_open = spec.additional is not None
    inside = stack[:-1] + ((OBJ, spec, seen, O_KEY, None),)
    if names:
        return inside + ((KEY, names, "", is_open),)
    return inside + ((STR, 0),) if is_open else None


def _object(stack: State, frame: tuple[Any, ...], ch: str) -> State | None:
    phase = frame[3]
    if ch in WS:
        return stack
    spec, seen = frame[1], frame[2]
    if phase in (O_START, O_NEXT):
        if ch == '"':
            return _open_key(stack, frame)
        if ch == "}" and phase == O_START and spec.required <= seen:
            return _done(stack[:-1])
        return None
    if phase == O_COLON:
        if ch != ":":
            return None
        return stack[:-1] + ((OBJ, spec, seen, O_VALUE, None), (VALUE, frame[4]))
    assert phase == O_AFTER, frame
    if ch == "," and (spec.additional is not None or any(n not in seen for n in spec.names)):
        return stack[:-1] + ((OBJ, spec, seen, O_NEXT, None),)
    if ch == "}" and spec.required <= seen:
        return _done(stack[:-1])
    return None


def _array(stack: State, frame: tuple[Any, ...], ch: str) -> State | None:
    phase = frame[2]
    if ch in WS:
        return stack
    if phase == A_AFTER:
        if ch == ",":
            return stack[:-1] + ((ARR, frame[1], A_NEXT),)
        return _done(stack[:-1]) if ch == "]" else None
    if ch == "]" and phase == A_START:
        return _done(stack[:-1])
    return _start_value(stack[:-1] + ((ARR, frame[1], A_VALUE),), frame[1], ch)


def step(stack: State, ch: str) -> State | None:
    """The state after one more character ``ch``, or None when JSON cannot go on so."""
    frame = stack[-1]
    tag = frame[0]
    if tag == STR:
        return _string(stack, frame[1], ch)
    if tag == KEY:
        return _key(stack, frame, ch)
    if tag == NUM:
        return _number(stack, frame[1], frame[2], ch)
    if tag == LIT:
        return _literal(stack, frame[1], frame[2], ch)
    if tag == OBJ:
        return _object(stack, frame, ch)
    if tag == ARR:
        return _array(stack, frame, ch)
    if tag == VALUE:
        if ch in WS:
            return stack
        return _start_value(stack[:-1], frame[1], ch)
    assert tag == END and frame[1], frame
    return stack if ch in WS else None


def complete(stack: State) -> bool:
    """The text so far is a whole JSON value (a number may still grow)."""
    while True:
        frame = stack[-1]
        tag = frame[0]
        if tag == END:
            return bool(frame[1])
        if (tag == NUM and frame[1] in _N_ACCEPTING) or (tag == LIT and frame[2] in frame[1]):
            stack = _done(stack[:-1])
            continue
        return False


def structural(stack: State) -> bool:
    """Whitespace next would sit between JSON tokens (not inside a string)."""
    frame = stack[-1]
    tag = frame[0]
    return tag in _STRUCTURAL or (tag == LIT and not frame[2].startswith('"'))


def closed(stack: State) -> bool:
    """The value ended and nothing but whitespace may follow."""
    frame = stack[-1]
    return frame[0] == END and bool(frame[1])

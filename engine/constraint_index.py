"""Token masks for the JSON constraint: a per-vocabulary trie and per-state caches.

Which tokens may come next depends only on the recognizer state (``engine.json_grammar``),
so masks are cached per state. A cache miss walks a radix trie of the token texts from
that state, one character at a time, pruning a whole subtree at the first character JSON
refuses; character steps are themselves memoised per (state id, character), so the walk
mostly costs dict lookups. Inside a free string nearly every token is allowed, so that
case does not walk the big trie: tokens made only of plain string characters are taken
from a precomputed mask, and only the suffixes of the other tokens (from their first
quote, backslash or control character) are walked.

Whitespace between JSON tokens is capped here, not in the grammar (where it would
multiply the states): in a structural state after a run of ``r`` whitespace characters,
tokens starting with more than ``MAX_WS - r`` of them are masked out.

Per tokenizer (``TokenIndex``, built once per token-text list): the trie, the plain mask
and each token's leading whitespace. Per schema (``Grammar``, one per compiled root node):
interned states, memoised steps and an LRU of masks, shared by every request with that
schema. Both are bounded: the memo starts afresh past ``MAX_STATES`` / ``MAX_STEPS``.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence

import numpy as np

from engine.json_grammar import MAX_WS, STR, WS, State, step, structural
from engine.json_schema import Node

__all__ = ["Allowed", "Grammar", "TokenIndex", "grammar_for", "index_for"]

#: Masks kept per grammar: at most this many, in at most this many bytes (a mask of many
#: tokens is one byte per token; one of few tokens, their ids).
MASK_CACHE = 4096
MASK_CACHE_BYTES = 32 * 1024 * 1024
#: Interned states / memoised steps before a grammar starts a fresh memo (~100 bytes a step).
MAX_STATES = 50_000
MAX_STEPS = 500_000
_keys = itertools.count()
_WS_CHARS = "".join(sorted(WS))


def _first_special(text: str) -> int:
    """Index of the first character with a meaning inside a JSON string, or -1."""
    for i, ch in enumerate(text):
        if ch == '"' or ch == "\\" or ch < " ":
            return i
    return -1


class _Trie:
    """A radix trie: node i has ``edges[i]`` (label as code points, child) and the token
    ids ``ends[i]`` whose text ends at it."""

    def __init__(self, items: Sequence[tuple[str, int]]) -> None:
        root: dict[str, dict] = {}
        ids_of: dict[int, list[int]] = {}
        for text, token in items:
            node = root
            for ch in text:
                node = node.setdefault(ch, {})
            ids_of.setdefault(id(node), []).append(token)
        self.edges: list[tuple[tuple[tuple[int, ...], int], ...]] = []
        self.ends: list[tuple[int, ...]] = []
        todo: list[tuple[dict[str, dict], int]] = [(root, self._new(()))]
        while todo:
            node, index = todo.pop()
            edges = []
            for ch, child in node.items():
                label = ch
                while len(child) == 1 and id(child) not in ids_of:  # compress the chain
                    ((nxt_ch, child),) = child.items()
                    label += nxt_ch
                target = self._new(tuple(ids_of.get(id(child), ())))
                edges.append((tuple(map(ord, label)), target))
                if child:
                    todo.append((child, target))
            self.edges[index] = tuple(edges)

    def _new(self, ends: tuple[int, ...]) -> int:
        self.edges.append(())
        self.ends.append(ends)
        return len(self.ends) - 1


class TokenIndex:
    """Per-vocabulary data: the trie of token texts and the plain-string tokens.
    Tokens with empty text and ``banned`` ones (special tokens) are never allowed."""

    def __init__(self, texts: Sequence[str], banned: Collection[int] = ()) -> None:
        self.size = len(texts)
        self.key = next(_keys)
        skip = set(banned)
        self.plain = np.zeros(self.size, dtype=bool)
        #: Leading whitespace characters of each token.
        self.lead_ws = np.zeros(self.size, dtype=np.int32)
        main: list[tuple[str, int]] = []
        special: list[tuple[str, int]] = []
        for token, text in enumerate(texts):
            if not text or token in skip:
                continue
            main.append((text, token))
            self.lead_ws[token] = len(text) - len(text.lstrip(_WS_CHARS))
            at = _first_special(text)
            if at < 0:
                self.plain[token] = True
            else:
                special.append((text[at:], token))
        self.trie = _Trie(main)
        #: Suffixes from the first special character, for free-string states.
        self.special = _Trie(special)


class Allowed:
    """The tokens allowed in one state (read-only). Few tokens are kept as ids only (a
    cached state costs a few bytes); many as a bool mask."""

    __slots__ = ("_mask", "count", "ids", "size")

    def __init__(self, mask: np.ndarray) -> None:
        mask.flags.writeable = False
        self.size = mask.shape[0]
        self.count = int(np.count_nonzero(mask))
        #: Ascending ids when they are few (an eighth of the vocabulary at most), else None.
        self.ids: np.ndarray | None = None
        self._mask: np.ndarray | None = mask
        if 8 * self.count <= self.size:
            self.ids = np.flatnonzero(mask)
            self.ids.flags.writeable = False
            self._mask = None

    @property
    def mask(self) -> np.ndarray:
        """A read-only bool mask over the vocabulary."""
        if self._mask is not None:
            return self._mask
        mask = np.zeros(self.size, dtype=bool)
        assert self.ids is not None
        mask[self.ids] = True
        mask.flags.writeable = False
        return mask

    @property
    def nbytes(self) -> int:
        return self._mask.nbytes if self._mask is not None else \
            (self.ids.nbytes if self.ids is not None else 0)


class _Memo:
    """Interned states and memoised steps; a step is keyed ``sid << 21 | code point``."""

    def __init__(self) -> None:
        self.ids: dict[State, int] = {}
        self.states: list[State] = []
        self.trans: dict[int, int] = {}
        self.masks: OrderedDict[tuple[int, int], Allowed] = OrderedDict()
        self.mask_bytes = 0

    def intern(self, state: State) -> int:
        sid = self.ids.get(state)
        if sid is None:
            sid = self.ids[state] = len(self.states)
            self.states.append(state)
        return sid

    def advance(self, sid: int, code: int, keep_reject: bool = True) -> int:
        nxt = step(self.states[sid], chr(code))
        if nxt is None:
            if keep_reject:
                self.trans[sid << 21 | code] = -1
            return -1
        result = self.trans[sid << 21 | code] = self.intern(nxt)
        return result

    @property
    def full(self) -> bool:
        return len(self.states) > MAX_STATES or len(self.trans) > MAX_STEPS

    def keep(self, key: tuple[int, int], allowed: Allowed) -> None:
        self.masks[key] = allowed
        self.mask_bytes += allowed.nbytes
        while len(self.masks) > MASK_CACHE or self.mask_bytes > MASK_CACHE_BYTES:
            _, old = self.masks.popitem(last=False)
            self.mask_bytes -= old.nbytes


def _walk(trie: _Trie, sid: int, memo: _Memo) -> list[int]:
    """Ids of the tokens in ``trie`` whose whole text can follow state ``sid``.

    Rejections at the root are not memoised: a state is walked from the root once per
    mask, and most of the root's edges are rejections (they would fill the memo)."""
    edges, ends, trans, advance = trie.edges, trie.ends, memo.trans, memo.advance
    out: list[int] = []
    todo = [(0, sid)]
    while todo:
        node, start = todo.pop()
        for label, child in edges[node]:
            state = start
            for code in label:
                nxt = trans.get(state << 21 | code)
                if nxt is None:
                    nxt = advance(state, code, node != 0)
                if nxt < 0:
                    break
                state = nxt
            else:
                out.extend(ends[child])
                if edges[child]:
                    todo.append((child, state))
    return out


class Grammar:
    """The caches of one compiled schema: interned states, steps and masks."""

    def __init__(self, root: Node) -> None:
        self.root = root
        self._memo = _Memo()
        #: Masks computed (cache misses), for benchmarks and tests.
        self.misses = 0

    def allowed(self, index: TokenIndex, state: State, ws_run: int = 0) -> Allowed:
        """The tokens that may follow ``state``, after ``ws_run`` whitespace characters
        (counted only when ``state`` is structural)."""
        base = self._base(index, state)
        if ws_run <= 0 or not structural(state):
            return base
        return Allowed(base.mask & (index.lead_ws <= max(MAX_WS - ws_run, 0)))

    def _base(self, index: TokenIndex, state: State) -> Allowed:
        memo = self._memo
        if memo.full:
            memo = self._memo = _Memo()
        sid = memo.intern(state)
        key = (index.key, sid)
        hit = memo.masks.get(key)
        if hit is not None:
            memo.masks.move_to_end(key)
            return hit
        self.misses += 1
        top = state[-1]
        if top[0] == STR and top[1] == 0:  # free string: plain tokens + special suffixes
            mask = index.plain.copy()
            found = _walk(index.special, sid, memo)
        else:
            mask = np.zeros(index.size, dtype=bool)
            found = _walk(index.trie, sid, memo)
        if found:
            mask[np.asarray(found, dtype=np.intp)] = True
        if structural(state):
            mask &= index.lead_ws <= MAX_WS
        allowed = Allowed(mask)
        memo.keep(key, allowed)
        return allowed


_lock = threading.Lock()
_grammars: OrderedDict[int, Grammar] = OrderedDict()
_indexes: OrderedDict[tuple[int, int, frozenset[int]], tuple[Sequence[str], TokenIndex]] = \
    OrderedDict()


def grammar_for(root: Node) -> Grammar:
    with _lock:
        grammar = _grammars.get(id(root))
        if grammar is None or grammar.root is not root:
            grammar = _grammars[id(root)] = Grammar(root)
        _grammars.move_to_end(id(root))
        while len(_grammars) > 64:
            _grammars.popitem(last=False)
        return grammar


def index_for(texts: Sequence[str], banned: Collection[int] = ()) -> TokenIndex:
    """The index of ``texts`` (cached while the same list object is in use)."""
    key = (id(texts), len(texts), frozenset(banned))
    with _lock:
        cached = _indexes.get(key)
        if cached is not None and cached[0] is texts:
            _indexes.move_to_end(key)
            return cached[1]
    index = TokenIndex(texts, banned)
    with _lock:
        _indexes[key] = (texts, index)
        while len(_indexes) > 8:
            _indexes.popitem(last=False)
    return index

"""Seeded mutation fuzzing of the parsers of outside input (tests/fuzz/test_parsers_fuzz.py).

Each input is a real one (a shipped fixture, a capture in ../shared/data, what the stand-ins
serve) mutated once: a byte flipped, the text cut short, a value nested thousands deep, a value
swapped for one of another type (a list, an object, a bool, null), a huge number, Unicode digits,
an odd name (`leaf1\\n`, a bidirectional override), a line made 80 KB long, or YAML aliases. The
parser may accept it or refuse it with its own declared error; anything else it raises is a
finding. Each input's CPU time is measured.

Memory is bounded for every input by the process's peak resident set: before the run, free heap is
handed back to the kernel (gc, malloc_trim) and the peak (VmHWM) is reset to the resident set by
writing 5 to /proc/self/clear_refs; after it, the peak may have grown by less than MEMORY_BOUND.
No input's peak can be above the run's, so this bounds every one of the 10,000, at the cost of one
getrusage per input (which also names the input during which the peak last rose). What it cannot
see is memory an input reuses that the process already held free (little, after the trim), so it
is an upper bound on the run, not an exact figure per input. The finer check, each input's own
allocations counted by tracemalloc, runs on a seeded sample of one input in MEMORY_SHARE and on
the RETRACE_SLOWEST slowest inputs, parsed again after the run (the big allocators are the slow
ones). Tracing slows allocation several-fold, which is why it is not run on every input: tracing
every input, or one in sixteen and every input over 10 ms, cost a third to most of a run. The
bounds asserted are safety nets far above what any input takes (not benchmarks), so a run under
load cannot flake.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import heapq
import random
import re
import resource
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TIME_BOUND = 1.0  # CPU seconds one input may take (the slowest take milliseconds); CPU time, so a loaded machine does not count
MEMORY_BOUND = (
    64 << 20
)  # bytes one input may allocate at its peak (tracemalloc), and the run's peak RSS may grow
MEMORY_SHARE = 64  # one input in this many (a seeded draw) is parsed under tracemalloc
RETRACE_SLOWEST = 8  # the slowest inputs not traced in the run are parsed again under tracemalloc after it

# JSON values of other types and shapes than the ones they replace
ODD_JSON = [
    "[]", "{}", '[["x"]]', '{"a": {"b": [1]}}', "true", "false", "null", "1e400", "-1", "1.5", "0",
    "1" * 5000, '"' + "9" * 5000 + '"', '"\u0661\u0662\u0663"', '"\u00b2"', '"_"', '"leaf1\\n"', '"\\u202eleaf1"',
    '"\\u0000"', '"' + "x" * 100_000 + '"', "[" * 3000 + "]" * 3000, "[" * 60 + "1" + "]" * 60,
    '{"value": {"value": {"value": []}}}', '"0123456789abcdef_\u00b2"', '"0x"', '""', '" "',
]  # fmt: skip
ODD_TEXT = ["\u0661\u0662", "\u00b2", "9" * 5000, "leaf1\n", "\u202e", "\x00", "x" * 100_000, "_", "-", "[", "]",
            "'", '"', "#", "(", ")", "=", "0x", "1-100000000", "\u200b"]  # fmt: skip
FLIPS = "0123456789abcdefxX_-[](){}'\":=,.#&*! \t\n\x00\u0661\u00b2\u202e\ufeff"
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null')
_WORD = re.compile(r"[^\s\[\]()\"',=:;]+")
_DIGITS = re.compile(r"\d+")


def flip(text: str, rng: random.Random) -> str:
    """One to four characters replaced by characters that matter to parsers."""
    for _ in range(rng.randint(1, 4)):
        if text:  # (the character is drawn first, as `chars[randrange(...)] = choice(...)` drew it)
            char = rng.choice(FLIPS)
            at = rng.randrange(len(text))
            text = text[:at] + char + text[at + 1 :]
    return text


def truncate(text: str, rng: random.Random) -> str:
    return text[: rng.randrange(len(text) + 1)]


def nest(text: str, rng: random.Random) -> str:
    """Brackets opened (and closed) thousands deep at a random place."""
    at, depth = rng.randrange(len(text) + 1), rng.choice([40, 1000, 5000, 50_000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}"), ("[", "")])
    return text[:at] + opener * depth + closer * depth + text[at:]


def swap_json(text: str, rng: random.Random) -> str:
    """A JSON token (string, number, literal) replaced by a value of another type or shape."""
    return _swap(text, rng, _JSON_TOKEN, ODD_JSON)


def swap_word(text: str, rng: random.Random) -> str:
    """A word of a line format replaced by an odd one (Unicode digits, a huge number, a bracket)."""
    return _swap(text, rng, _WORD, ODD_TEXT)


@functools.lru_cache(maxsize=64)
def _matches(pattern: re.Pattern[str], text: str) -> tuple[re.Match[str], ...]:
    """Every match of `pattern` in `text`, found once per seed (each seed is mutated a thousand
    times; finding them again for each input was a tenth of a run)."""
    return tuple(pattern.finditer(text))


def _swap(text: str, rng: random.Random, pattern: re.Pattern[str], odd: list[str]) -> str:
    """One match of `pattern` replaced by one of `odd` (a flip where nothing matches)."""
    matches = _matches(pattern, text)
    if not matches:
        return flip(text, rng)
    match = rng.choice(matches)
    return text[: match.start()] + rng.choice(odd) + text[match.end() :]


def digits(text: str, rng: random.Random) -> str:
    """ASCII digits made Unicode digits (Arabic-Indic, superscripts, fullwidth), or huge."""
    table = rng.choice([str.maketrans("0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"),
                        str.maketrans("123", "\u00b9\u00b2\u00b3"), str.maketrans("0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19")])  # fmt: skip
    runs = _matches(_DIGITS, text)
    if not runs:
        return text
    run = rng.choice(runs)
    replacement = run.group().translate(table) if rng.random() < 0.7 else "9" * rng.choice([30, 5000])
    return text[: run.start()] + replacement + text[run.end() :]


def long_line(text: str, rng: random.Random) -> str:
    """One line made 80 KB long by repeating a piece of it (the shape that made regexes quadratic)."""
    lines = text.splitlines(keepends=True) or [text]
    index = rng.randrange(len(lines))
    line = lines[index].rstrip("\n")
    piece = line[rng.randrange(max(1, len(line))) :][:12] or "a' - '"
    lines[index] = line + piece * (80_000 // len(piece)) + "\n"
    return "".join(lines)


def duplicate(text: str, rng: random.Random) -> str:
    """A slice of the text repeated (a duplicated line, block or item)."""
    a = rng.randrange(len(text) + 1)
    b = min(len(text), a + rng.randrange(1, 400))
    return text[:b] + text[a:b] * rng.randint(1, 50) + text[b:]


def yaml_alias(text: str, rng: random.Random) -> str:
    """Billion laughs in front of the document, or an anchor and alias inside it."""
    if rng.random() < 0.5:
        laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
        return "\n".join(laughs) + "\n" + text
    lines = text.splitlines()
    i, j = rng.randrange(len(lines) or 1), rng.randrange(len(lines) or 1)
    if lines and ": " in lines[i] and ": " in lines[j]:
        lines[i] = lines[i].replace(": ", ": &anchor ", 1)
        lines[j] = lines[j].split(": ", 1)[0] + ": *anchor"
    return "\n".join(lines)


JSON_MUTATIONS: dict[str, Callable[[str, random.Random], str]] = {
    "flip": flip, "truncate": truncate, "nest": nest, "swap": swap_json, "digits": digits, "duplicate": duplicate,
}  # fmt: skip
LINE_MUTATIONS: dict[str, Callable[[str, random.Random], str]] = {
    "flip": flip, "truncate": truncate, "swap": swap_word, "digits": digits, "long-line": long_line,
    "duplicate": duplicate,
}  # fmt: skip
YAML_MUTATIONS: dict[str, Callable[[str, random.Random], str]] = {**JSON_MUTATIONS, "alias": yaml_alias}


@dataclass
class FuzzRun:
    name: str
    inputs: int = 0
    accepted: int = 0
    refused: int = 0
    uncaught: list[str] = field(default_factory=list)
    slowest: float = 0.0
    slowest_what: str = ""
    peak: int = 0
    peak_what: str = ""
    traced: int = 0  # inputs whose memory was measured
    resident_growth: int | None = None  # bytes the peak RSS grew over the run (None: not reset)
    resident_what: str = ""  # the input during which the peak RSS last rose
    by_mutation: Counter[str] = field(default_factory=Counter)

    def record(self, what: str, kind: str, outcome: Exception | None, allowed: tuple[type[BaseException], ...],
               elapsed: float, peak: int | None, text: str) -> None:  # fmt: skip
        """One input's outcome, CPU time and (if traced, `peak` not None) memory peak counted."""
        self.inputs += 1
        self.by_mutation[kind] += 1
        if outcome is None:
            self.accepted += 1
        elif isinstance(outcome, allowed):
            self.refused += 1
        else:  # the finding: recorded, asserted empty by the test
            self.uncaught.append(
                f"{what}: {type(outcome).__name__}: {str(outcome)[:200]} (input starts {text[:120]!r})"
            )
        if elapsed > self.slowest:
            self.slowest, self.slowest_what = elapsed, what
        if peak is not None:
            self.record_peak(what, peak)

    def record_peak(self, what: str, peak: int) -> None:
        self.traced += 1
        if peak > self.peak:
            self.peak, self.peak_what = peak, what

    def line(self) -> str:
        growth = (
            "not measured" if self.resident_growth is None else f"+{self.resident_growth / 2**20:.1f} MiB"
        )
        return (f"FUZZ {self.name}: {self.inputs} inputs, {self.accepted} read, {self.refused} refused with the "
                f"parser's own error, {len(self.uncaught)} uncaught; slowest {self.slowest * 1e3:.1f} ms "
                f"({self.slowest_what}), peak {self.peak / 2**20:.1f} MiB ({self.peak_what}) of {self.traced} traced; "
                f"peak RSS of all {self.inputs} {growth} ({self.resident_what or 'none raised it'})")  # fmt: skip


class ResidentPeak:
    """The process's peak resident set (VmHWM) over a stretch of work, from a reset at its start:
    Linux resets the peak to the current resident set when 5 is written to /proc/self/clear_refs."""

    def __init__(self) -> None:
        gc.collect()
        gc.freeze()  # what was alive before (pytest's own objects) is not rescanned by every collection of the run
        _trim_heap()
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
            self.baseline: int | None = _vm_hwm()
        except OSError:  # not Linux, or not permitted: no bound then, and the test says so
            self.baseline = None
        self.seen = _max_rss()
        self.what = ""

    def after(self, what: str) -> None:
        """Called after each input: names it if the peak rose while it ran (getrusage, ~3 us)."""
        now = _max_rss()
        if now > self.seen:
            self.seen, self.what = now, what

    def growth(self) -> int | None:
        return None if self.baseline is None else _vm_hwm() - self.baseline


def _trim_heap() -> None:
    """Free heap handed back to the kernel (glibc's malloc_trim), so that what an input allocates
    shows as resident growth instead of reusing memory the process held free."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: looser by what the heap holds free
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _vm_hwm() -> int:
    """The process's peak resident set in bytes (VmHWM of /proc/self/status)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise OSError("no VmHWM in /proc/self/status")


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10  # KiB on Linux


def fuzz(
    name: str,
    parse: Callable[[str], object],
    seeds: Sequence[str],
    mutations: dict[str, Callable[[str, random.Random], str]],
    allowed: tuple[type[BaseException], ...],
    *,
    count: int = 10_000,
    seed: int = 22,
) -> FuzzRun:
    """`count` mutated seeds through `parse`, every one timed and under the run's peak RSS. Memory
    is also measured (tracemalloc) on a seeded sample and on the slowest inputs, run again after
    the run: `parse` must be deterministic."""
    rng, sample = random.Random(seed), random.Random(seed + 1)  # the sample draws apart: same inputs
    run = FuzzRun(name)
    names = sorted(mutations)
    slowest: list[tuple[float, int, str]] = []  # (CPU time, index, text) of the slowest untraced inputs
    resident = ResidentPeak()
    try:
        for index in range(count):
            kind = names[index % len(names)]
            text = mutations[kind](rng.choice(seeds), rng)
            what = f"#{index} {kind}"
            traced = sample.randrange(MEMORY_SHARE) == 0
            outcome, elapsed, peak = _parse_once(parse, text, traced)
            resident.after(what)
            if not traced:
                _keep_slowest(slowest, (elapsed, index, text))
            run.record(what, kind, outcome, allowed, elapsed, peak if traced else None, text)
        run.resident_growth, run.resident_what = resident.growth(), resident.what
    finally:
        gc.unfreeze()
    for _, index, text in slowest:
        _, _, peak = _parse_once(parse, text, True)
        run.record_peak(f"#{index} {names[index % len(names)]}", peak)
    return run


def _keep_slowest(slowest: list[tuple[float, int, str]], entry: tuple[float, int, str]) -> None:
    if len(slowest) < RETRACE_SLOWEST:
        heapq.heappush(slowest, entry)
    elif entry > slowest[0]:
        heapq.heapreplace(slowest, entry)


def _parse_once(
    parse: Callable[[str], object], text: str, traced: bool
) -> tuple[Exception | None, float, int]:
    """What `parse(text)` raised (None if it read it), its CPU time, and its memory peak in bytes
    (0 unless `traced`)."""
    if traced:
        tracemalloc.start()
    started = time.process_time()
    outcome: Exception | None = None
    try:
        parse(text)
    except Exception as exc:  # sorted by the caller: the parser's own error, or a finding
        outcome = exc
    elapsed = time.process_time() - started
    peak = 0
    if traced:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return outcome, elapsed, peak

"""worker/stops.py: stop strings that span tokens, held-back prefixes, flush."""

from __future__ import annotations

import random

import pytest

from worker.stops import StopMatcher


def run(stops: tuple[str, ...], chunks: list[str]) -> tuple[str, bool, list[str]]:
    """Feed chunks until a stop matches. Returns (all emitted text, matched, per-feed output).

    On no match the held-back tail is flushed and appended, as the engine does when
    generation ends for another reason.
    """
    m = StopMatcher(stops)
    pieces: list[str] = []
    for c in chunks:
        out, hit = m.feed(c)
        pieces.append(out)
        if hit:
            return "".join(pieces), True, pieces
    tail = m.flush()
    pieces.append(tail)
    return "".join(pieces), False, pieces


# ---- basics -------------------------------------------------------------------------------------


def test_no_stops_is_passthrough() -> None:
    m = StopMatcher(())
    for piece in ["Hel", "lo", "", " wor", "ld\n"]:
        assert m.feed(piece) == (piece, False)
    assert m.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    m = StopMatcher(("", ""))
    assert m.stops == ()
    assert m.feed("anything") == ("anything", False)
    m = StopMatcher(("", "x"))
    assert m.stops == ("x",)
    assert m.feed("abxcd") == ("ab", True)


def test_match_in_single_feed() -> None:
    m = StopMatcher(("STOP",))
    assert m.feed("hello STOP world") == ("hello ", True)


def test_match_at_very_start() -> None:
    m = StopMatcher(("<eot>",))
    assert m.feed("<eot>trailing") == ("", True)


def test_text_without_any_stop_character_is_emitted_at_once() -> None:
    m = StopMatcher(("###",))
    assert m.feed("plain text") == ("plain text", False)
    assert m.flush() == ""


def test_stop_spanning_several_feeds_token_by_token() -> None:
    m = StopMatcher(("</end>",))
    assert m.feed("abc<") == ("abc", False)  # "<" could start the stop: held back
    assert m.feed("/e") == ("", False)
    assert m.feed("n") == ("", False)
    assert m.feed("d") == ("", False)
    out, hit = m.feed(">tail")
    assert (out, hit) == ("", True)


def test_stop_spanning_feeds_one_character_at_a_time() -> None:
    text = "The answer is 42.\n\nUser: next"
    emitted, hit, _ = run(("\n\nUser:",), list(text))
    assert hit
    assert emitted == "The answer is 42."


def test_held_back_prefix_released_when_disproved() -> None:
    m = StopMatcher(("</end>",))
    assert m.feed("a</e") == ("a", False)
    # "</ex" cannot start "</end>" any more: everything comes out.
    assert m.feed("x") == ("</ex", False)
    assert m.flush() == ""


def test_held_back_prefix_partly_released() -> None:
    # "aab": after "aa" the buffer ends in "a", which could still start "ab".
    m = StopMatcher(("ab",))
    assert m.feed("a") == ("", False)
    assert m.feed("a") == ("a", False)
    # Only the held "a" remains before the stop; the first "a" was already emitted.
    assert m.feed("b") == ("", True)


def test_disproved_prefix_may_itself_start_a_new_prefix() -> None:
    m = StopMatcher(("abc",))
    assert m.feed("ab") == ("", False)
    # "aba": "ab" is disproved but the final "a" may start "abc" again.
    assert m.feed("a") == ("ab", False)
    assert m.feed("bc") == ("", True)


def test_flush_returns_held_back_tail_and_resets() -> None:
    m = StopMatcher(("STOP",))
    assert m.feed("result ST") == ("result ", False)
    assert m.flush() == "ST"
    assert m.flush() == ""


def test_flush_when_nothing_held() -> None:
    m = StopMatcher(("STOP",))
    assert m.feed("nothing here") == ("nothing here", False)
    assert m.flush() == ""


def test_only_proper_prefixes_are_held() -> None:
    m = StopMatcher(("abc",))
    assert m.feed("xxab") == ("xx", False)
    assert m.flush() == "ab"


def test_longest_possible_prefix_is_held() -> None:
    # "aa" is a prefix of "aab" and so is "a"; the longer one must be held.
    m = StopMatcher(("aab",))
    assert m.feed("xaa") == ("x", False)
    assert m.feed("b") == ("", True)


def test_held_length_is_longest_over_all_stops() -> None:
    m = StopMatcher(("zzzz", "yz", "xyz"))
    # suffix "xy" is a prefix of "xyz"; "y" alone of "yz"; the longest wins.
    assert m.feed("abxy") == ("ab", False)
    assert m.flush() == "xy"


def test_empty_feed_emits_nothing_and_keeps_pending() -> None:
    m = StopMatcher(("STOP",))
    assert m.feed("ST") == ("", False)
    assert m.feed("") == ("", False)
    assert m.feed("OP") == ("", True)


# ---- several stops ------------------------------------------------------------------------------


def test_earliest_match_wins_in_one_feed() -> None:
    m = StopMatcher(("world", "lo"))
    # "lo" at 3 comes before "world" at 6, although "world" is listed first.
    assert m.feed("hello world") == ("hel", True)


def test_earliest_match_wins_regardless_of_order() -> None:
    for stops in [("C", "B", "A"), ("A", "B", "C"), ("B", "A", "C")]:
        m = StopMatcher(stops)
        assert m.feed("xxAyyBzzC") == ("xx", True), stops


def test_earliest_match_across_feeds() -> None:
    m = StopMatcher(("STOP", "END"))
    assert m.feed("one E") == ("one ", False)
    assert m.feed("ND two STOP") == ("", True)


def test_overlapping_stops_ab_and_b() -> None:
    # The text "xab": "ab" starts at 1, "b" at 2: the output ends before "ab".
    assert run(("ab", "b"), ["xab"])[:2] == ("x", True)
    assert run(("ab", "b"), ["x", "a", "b"])[:2] == ("x", True)
    assert run(("b", "ab"), ["x", "a", "b"])[:2] == ("x", True)
    # "b" alone still matches when not preceded by "a".
    assert run(("ab", "b"), ["x", "c", "b", "z"])[:2] == ("xc", True)


def test_overlapping_stops_held_a_then_disproved() -> None:
    m = StopMatcher(("ab", "b"))
    assert m.feed("a") == ("", False)
    assert m.feed("c") == ("ac", False)
    assert m.flush() == ""


def test_stop_that_is_prefix_of_another() -> None:
    # "ab" completes first in time and generation stops there.
    m = StopMatcher(("ab", "abcd"))
    assert m.feed("x") == ("x", False)
    assert m.feed("a") == ("", False)
    assert m.feed("b") == ("", True)


def test_shorter_stop_inside_longer_one_stops_at_first_complete_match() -> None:
    # Streaming cannot wait: when "bc" completes, generation ends even though "abcd" might
    # have completed later and started earlier. This mirrors llama-server.
    assert run(("bc", "abcd"), ["a", "b", "c", "d"])[:2] == ("a", True)
    # When both are complete within the same feed, the earliest start wins.
    assert run(("bc", "abcd"), ["abcd"])[:2] == ("", True)


def test_repeated_character_stop() -> None:
    assert run(("\n\n",), list("line1\nline2\n\nline3"))[:2] == ("line1\nline2", True)
    assert run(("\n\n",), list("a\nb\nc\n"))[:2] == ("a\nb\nc\n", False)


# ---- unicode ------------------------------------------------------------------------------------


def test_unicode_stop_spanning_feeds() -> None:
    stops = ("「終わり」",)
    text = "日本語のテキスト「終わり」その後"
    assert run(stops, list(text))[:2] == ("日本語のテキスト", True)


def test_emoji_and_combining_characters() -> None:
    stops = ("🛑", "e\u0301!")
    assert run(stops, ["go ", "🚀", " now", "🛑", "x"])[:2] == ("go 🚀 now", True)
    assert run(stops, ["caf", "e", "\u0301", "!", "rest"])[:2] == ("caf", True)
    # A held "e" + combining accent is released when the next char disproves it.
    m = StopMatcher(stops)
    assert m.feed("cafe\u0301") == ("caf", False)
    assert m.feed("?") == ("e\u0301?", False)


def test_unicode_no_match_round_trips() -> None:
    text = "ünïcödé ⁂ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 — 中文"
    emitted, hit, _ = run(("𝔘𝔫X",), list(text))
    assert (emitted, hit) == (text, False)


# ---- property-style -----------------------------------------------------------------------------


def _random_chunks(rng: random.Random, text: str) -> list[str]:
    chunks: list[str] = []
    i = 0
    while i < len(text):
        n = rng.choice([0, 1, 1, 1, 2, 3, 5])
        chunks.append(text[i : i + n])
        i += n
    if rng.random() < 0.3:
        chunks.append("")
    return chunks


def _nested_inside(stops: tuple[str, ...]) -> bool:
    """Whether some stop occurs inside another one and ends before that one ends.

    Only then can a streaming matcher legitimately stop earlier in time at a later position
    than the earliest occurrence in the finished text (see the "bc"/"abcd" test above).
    """
    for a in stops:
        for b in stops:
            start = a.find(b)
            while start != -1:
                if start + len(b) < len(a):
                    return True
                start = a.find(b, start + 1)
    return False


def _earliest(text: str, stops: tuple[str, ...]) -> int:
    found = [i for i in (text.find(s) for s in stops if s) if i != -1]
    return min(found) if found else -1


@pytest.mark.parametrize("seed", range(8))
def test_property_random_chunks_match_whole_text(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "abc \né"
    cases = 0
    while cases < 400:
        stops = tuple(
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        )
        if _nested_inside(stops):
            continue
        cases += 1
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        chunks = _random_chunks(rng, text)
        assert "".join(chunks) == text
        emitted, hit, _ = run(stops, chunks)
        cut = _earliest(text, stops)
        if cut == -1:
            assert (emitted, hit) == (text, False), (stops, chunks)
        else:
            assert (emitted, hit) == (text[:cut], True), (stops, chunks)


def _streaming_reference(chunks: list[str], stops: tuple[str, ...]) -> tuple[str, bool]:
    """What a generator that checks after every chunk would output: stop at the first chunk
    after which any stop string is complete, cutting at the earliest occurrence so far."""
    seen = ""
    for c in chunks:
        seen += c
        cut = _earliest(seen, stops)
        if cut != -1:
            return seen[:cut], True
    return seen, False


@pytest.mark.parametrize("seed", range(4))
def test_property_any_stops_match_streaming_reference(seed: int) -> None:
    rng = random.Random(1000 + seed)
    alphabet = "ab\n"
    for _ in range(500):
        stops = tuple(
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 4))
        )
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        chunks = _random_chunks(rng, text)
        assert run(stops, chunks)[:2] == _streaming_reference(chunks, stops), (stops, chunks)


@pytest.mark.parametrize("seed", range(4))
def test_property_emitted_text_never_contains_stop_and_hold_is_bounded(seed: int) -> None:
    rng = random.Random(2000 + seed)
    alphabet = "xy<>/"
    for _ in range(300):
        stops = tuple(
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5)))
            for _ in range(rng.randint(1, 3))
        )
        longest = max(len(s) for s in stops)
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        m = StopMatcher(stops)
        fed = ""
        emitted = ""
        for c in _random_chunks(rng, text):
            fed += c
            out, hit = m.feed(c)
            emitted += out
            # Emitted text is always a prefix of what was fed.
            assert fed.startswith(emitted)
            if hit:
                break
            # No stop string is ever emitted, and at most len(stop)-1 chars are held.
            assert all(s not in emitted for s in stops)
            assert len(fed) - len(emitted) <= longest - 1
        assert all(s not in emitted for s in stops)

"""The step rule (`tts.engine.steps`): where a step ends, what lies past it, and the
steps a finished job becomes. Fake tokens are single characters, so a boundary "\\n\\n"
always spans two tokens."""

import pytest

from tts.backends.base import FinishReason
from tts.backends.fake import EOS_CHAR, FakeGenerator, decode, encode
from tts.engine.requests import Request
from tts.engine.step_cutter import StepCutter
from tts.search.tree import Beam, StepEnd


class TwoEosGenerator(FakeGenerator):
    """A generator whose generation config adds a second end id ("#"), like Llama-3's."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset((self.eos_token_id, encode("#")[0]))


def job(limit: int = 50, **kw) -> Request:
    return Request(Beam("p", tuple(encode("<q>")), 1), limit, **kw)


def cut_text(j: Request, text: str, finish=None, gen=None) -> str:
    rest = StepCutter(gen or FakeGenerator()).consume(j, encode(text), finish)
    return decode(rest)


def test_boundary_ends_step_and_returns_the_rest():
    j = job()
    assert cut_text(j, "ab\n\ncd") == "cd"
    assert decode(j.tokens) == "ab\n\n" and j.end is StepEnd.BOUNDARY


def test_boundary_split_over_two_calls():
    j = job()
    assert cut_text(j, "ab\n") == "" and not j.finished
    assert cut_text(j, "\ncd") == "cd"
    assert decode(j.tokens) == "ab\n\n" and j.end is StepEnd.BOUNDARY


def test_every_end_id_ends_the_step_and_is_not_part_of_it():
    for text in ("ab" + EOS_CHAR + "cd", "ab#cd"):
        j = job()
        assert cut_text(j, text, gen=TwoEosGenerator()) == ""
        assert decode(j.tokens) == "ab" and j.end is StepEnd.EOS
    j = job()  # with one end id, "#" is text
    cut_text(j, "ab#cd")
    assert decode(j.tokens) == "ab#cd" and not j.finished


def test_token_limit():
    j = job(limit=3)
    assert cut_text(j, "abcdef") == "def"
    assert j.end is StepEnd.STEP_LIMIT


@pytest.mark.parametrize("finish, end", [(FinishReason.EOS, StepEnd.EOS),
                                         (FinishReason.LENGTH, StepEnd.STEP_LIMIT), (None, None)])
def test_request_end_when_tokens_run_out(finish, end):
    j = job()
    cut_text(j, "abc", finish)
    assert j.end is end


def test_to_eos_and_split_jobs_ignore_boundaries():
    for kw in ({"to_eos": True}, {"cut_into_steps": True}):
        j = job(**kw)
        assert cut_text(j, "a\n\nb" + EOS_CHAR) == ""
        assert decode(j.tokens) == "a\n\nb" and j.end is StepEnd.EOS


def test_adopt_takes_the_step_from_speculative_tokens_and_keeps_the_rest():
    j = job()
    j.beam.spec_tokens = tuple(encode("x\n\nyz"))
    StepCutter(FakeGenerator()).adopt(j)
    assert decode(j.tokens) == "x\n\n" and j.end is StepEnd.BOUNDARY
    assert j.adopted == 3 and decode(j.runon_tokens) == "yz" and j.beam.spec_tokens == ()
    partial = job()
    partial.beam.spec_tokens = tuple(encode("xy"))
    StepCutter(FakeGenerator()).adopt(partial)
    assert partial.adopted == 2 and not partial.finished and partial.runon_tokens == []


def test_split_job_becomes_steps_and_the_last_keeps_the_job_end():
    cutter = StepCutter(FakeGenerator())
    j = job(cut_into_steps=True)
    cutter.consume(j, encode("a\n\nbc\n\nd" + EOS_CHAR))
    steps = cutter.steps(j, total_left=100)
    assert [s.text for s in steps] == ["a\n\n", "bc\n\n", "d"]
    assert [s.end for s in steps] == [StepEnd.BOUNDARY, StepEnd.BOUNDARY, StepEnd.EOS]
    ends_on_boundary = job(cut_into_steps=True)
    cutter.consume(ends_on_boundary, encode("a\n\nb\n\n"), FinishReason.LENGTH)
    steps = cutter.steps(ends_on_boundary, total_left=100)
    assert [s.text for s in steps] == ["a\n\n", "b\n\n"] and steps[-1].end is StepEnd.STEP_LIMIT


def test_a_step_that_spends_the_path_budget_is_marked_total_limit():
    cutter = StepCutter(FakeGenerator())
    j = job(limit=4)
    cutter.consume(j, encode("abcd"))
    assert cutter.steps(j, total_left=4)[0].end is StepEnd.TOTAL_LIMIT
    assert cutter.steps(j, total_left=5)[0].end is StepEnd.STEP_LIMIT
    eos = job()
    cutter.consume(eos, encode("ab" + EOS_CHAR))
    assert cutter.steps(eos, total_left=2)[0].end is StepEnd.EOS  # an answer, not a cut-off

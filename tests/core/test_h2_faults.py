"""`H2Faults`: a connection's HTTP/2 faults answer the shared `Effects`, one command per action
and the earliest deadline as the wake time, as a pipeline answers for a stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from middlebox.core.fault import DropConnection, Effects, ResetStream, SendGoaway
from middlebox.core.h2_faults import H2Action, H2Fault, H2Faults


@dataclass
class Scripted(H2Fault):
    """Answers each hook with what `script` holds for it, and records what it was fed."""

    script: dict[str, list[H2Action]] = field(default_factory=dict)
    due: float | None = None
    credit: int | None = None
    settings: dict[int, int] = field(default_factory=dict)
    fed: list[tuple[str, object, float]] = field(default_factory=list)

    def _answer(self, hook: str, subject: object, now: float) -> list[H2Action]:
        self.fed.append((hook, subject, now))
        return list(self.script.get(hook, []))

    def h2_settings(self) -> dict[int, int]:
        return self.settings

    def on_connection_open(self, now: float) -> list[H2Action]:
        return self._answer("open", None, now)

    def on_stream_open(self, stream_id: int, now: float) -> list[H2Action]:
        return self._answer("stream_open", stream_id, now)

    def on_stream_data(self, stream_id: int, data: bytes, now: float) -> list[H2Action]:
        return self._answer("stream_data", (stream_id, data), now)

    def on_stream_close(self, stream_id: int, now: float) -> list[H2Action]:
        return self._answer("stream_close", stream_id, now)

    def h2_deadline(self) -> float | None:
        return self.due

    def on_h2_deadline(self, now: float) -> list[H2Action]:
        return self._answer("wake", None, now)

    def send_credit(self, stream_id: int, now: float) -> int | None:
        return self.credit


def test_a_reset_stream_is_a_command_of_the_effects() -> None:
    fault = Scripted({"stream_data": [ResetStream(3, 0x8)]})
    effects = H2Faults([fault]).stream_data(3, b"data: x\n\n", 1.5)
    assert isinstance(effects, Effects)
    assert effects.commands == (ResetStream(3, 0x8),)
    assert effects.items == [] and effects.wake is None and not effects.ended
    assert fault.fed == [("stream_data", (3, b"data: x\n\n"), 1.5)]


def test_a_goaway_is_a_command_of_the_effects() -> None:
    fault = Scripted({"stream_open": [SendGoaway(5, 0xB)]})
    effects = H2Faults([fault]).stream_open(5, 0.25)
    assert effects.commands == (SendGoaway(5, 0xB),)
    assert fault.fed == [("stream_open", 5, 0.25)]


def test_a_dropped_connection_is_a_command_of_the_effects() -> None:
    fault = Scripted({"wake": [DropConnection("fin")]})
    effects = H2Faults([fault]).wake(2.0)
    assert effects.commands == (DropConnection("fin"),)
    assert fault.fed == [("wake", None, 2.0)]


def test_no_action_is_no_command() -> None:
    faults = H2Faults([Scripted({"stream_open": [ResetStream(1, 0x8)]})])
    assert faults.open(0.0).commands == ()
    assert faults.stream_close(1, 0.0).commands == ()


def test_the_commands_keep_path_order_across_faults() -> None:
    first = Scripted({"stream_close": [SendGoaway(1)]})
    second = Scripted({"stream_close": [ResetStream(3, 0x2), DropConnection("rst")]})
    effects = H2Faults([first, second]).stream_close(1, 0.0)
    assert effects.commands == (SendGoaway(1), ResetStream(3, 0x2), DropConnection("rst"))
    assert first.fed == second.fed == [("stream_close", 1, 0.0)]


def test_the_wake_is_the_earliest_deadline_after_the_event() -> None:
    early, late, idle = Scripted(due=4.0), Scripted(due=2.5), Scripted()
    faults = H2Faults([early, late, idle])
    assert faults.open(0.0).wake == 2.5
    late.due = None
    assert faults.deadline() == 4.0
    early.due = None
    assert faults.wake(4.0).wake is None


def test_the_credit_is_the_smallest_granted_and_none_without_a_grant() -> None:
    assert H2Faults([Scripted(), Scripted()]).credit(1, 0.0) is None
    assert H2Faults([Scripted(credit=100), Scripted(), Scripted(credit=7)]).credit(1, 0.0) == 7
    assert H2Faults([Scripted(credit=0)]).credit(1, 0.0) == 0


def test_settings_merge_with_the_later_fault_winning() -> None:
    faults = H2Faults([Scripted(settings={3: 10, 4: 65535}), Scripted(settings={3: 2})])
    assert faults.settings() == {3: 2, 4: 65535}


def test_no_faults_is_falsy_and_answers_nothing() -> None:
    faults = H2Faults()
    assert not faults
    assert H2Faults([Scripted()])
    effects = faults.stream_open(1, 0.0)
    assert effects.commands == () and effects.wake is None
    assert faults.credit(1, 0.0) is None

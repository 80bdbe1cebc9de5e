"""The chat's answer to a conversation that no longer fits the model's context: the
banner's numbers, and leaving the oldest messages out of what is sent (never deleting
them: they stay in the database, the transcript, marked "not sent to the model", and the
export). Leaving out is offered only when it can help: when the last exchange alone,
estimated from the worker's count in proportion to characters, leaves room to answer.
A mixin of :class:`app.views.chat_view.ChatView`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.store import Message
from app.views.chat_answer import AnswerEnd, context_length, cut_point, fits_without_older

if TYPE_CHECKING:
    from app.context import AppContext
    from app.store import ChatStore, Conversation
    from app.views.chat_parts import ChatInput, ContextBanner, SamplingPanel


class ContextFitting:
    if TYPE_CHECKING:  # what the chat view has
        ctx: AppContext
        store: ChatStore
        settings: SamplingPanel
        banner: ContextBanner
        input: ChatInput
        _conv: Conversation | None
        _overflow: int | None

        @property
        def answering(self) -> bool: ...
        def _answer(self) -> bool: ...
        def _render_all(self) -> None: ...
        def _refresh_conversation(self) -> None: ...
        def new_conversation(self) -> int: ...

    def drop_oldest(self) -> bool:
        """Leave the oldest messages (whole exchanges, enough to fit) out of what is sent
        and send again. They stay in the conversation, marked as not sent."""
        if self._conv is None or self.answering:
            return False
        messages = self.store.sent_messages(self._conv.id)
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not self._can_leave_out(messages):
            return False
        cut = cut_point([len(m.content) for m in messages], users, self._overflow,
                        context_length(self.ctx), self._answer_room())
        self.store.set_context_from(self._conv.id, messages[cut].position)
        self._refresh_conversation()
        self._render_all()
        self.banner.hide()
        return self._answer() if messages[-1].role == "user" else True

    def _answer_room(self) -> int:
        return max(64, min(self.settings.max_tokens.value(),
                           (context_length(self.ctx) or 0) // 4))

    def _can_leave_out(self, messages: list[Message]) -> bool:
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        return fits_without_older([len(m.content) for m in messages], users, self._overflow,
                                  context_length(self.ctx), self._answer_room())

    def _show_overflow(self, end: AnswerEnd) -> None:
        self._overflow = end.prompt_tokens()
        sent = self.store.sent_messages(end.conversation_id)
        self.banner.show_overflow(self._overflow, context_length(self.ctx),
                                  self._can_leave_out(sent))

    def _banner_new_chat(self) -> None:
        last = next((m for m in reversed(self.store.messages(self._conv.id))
                     if m.role == "user"), None) if self._conv else None
        self.new_conversation()
        if last is not None:
            self.input.setPlainText(last.content)

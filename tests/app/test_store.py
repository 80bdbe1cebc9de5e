"""The chat store: conversations and messages in SQLite, saved while an answer streams."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.store import ChatStore, Conversation, Message, StreamWriter


def conv_of(store: ChatStore, conv_id: int) -> Conversation:
    conv = store.conversation(conv_id)
    assert conv is not None
    return conv


def message_of(store: ChatStore, message_id: int) -> Message:
    message = store.message(message_id)
    assert message is not None
    return message


def test_conversations_create_rename_list_search_delete(tmp_path: Path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    first = store.create_conversation("Rust lifetimes", system_prompt="be brief",
                                      sampling={"temperature": 0.2})
    second = store.create_conversation("Dinner")
    store.add_message(second.id, "user", "how long do I boil an egg?")
    assert [c.id for c in store.list_conversations()] == [second.id, first.id]
    assert first.session_id and first.session_id != second.session_id
    assert conv_of(store, first.id).sampling == {"temperature": 0.2}

    store.rename_conversation(first.id, "Borrowing")
    assert conv_of(store, first.id).title == "Borrowing"
    assert [c.id for c in store.search_conversations("borrow")] == [first.id]  # title
    assert [c.id for c in store.search_conversations("EGG")] == [second.id]  # content
    assert store.search_conversations("100%") == []  # LIKE wildcards are literal

    store.delete_conversation(second.id)
    assert [c.id for c in store.list_conversations()] == [first.id]
    assert store.messages(second.id) == []  # its messages went with it


def test_messages_in_order_update_truncate_and_export(tmp_path: Path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    conv = store.create_conversation("Numbers", system_prompt="count")
    ids = [store.add_message(conv.id, role, text).id for role, text in
           (("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four"))]
    assert [m.position for m in store.messages(conv.id)] == [0, 1, 2, 3]
    store.update_message(ids[3], content="four!", state="stopped", tokens=7, prompt_tokens=30,
                         note="stopped")
    last = message_of(store, ids[3])
    assert (last.content, last.state, last.tokens, last.prompt_tokens) == ("four!", "stopped",
                                                                            7, 30)
    assert store.truncate_after(conv.id, 1) == 2
    assert [m.content for m in store.messages(conv.id)] == ["one", "two"]
    assert store.add_message(conv.id, "user", "again").position == 2

    md = store.export_markdown(conv.id)
    assert md.startswith("# Numbers") and "## You" in md and "two" in md and "again" in md
    data = store.export_json(conv.id)
    assert data["title"] == "Numbers" and data["system_prompt"] == "count"
    assert [(m["role"], m["content"]) for m in data["messages"]] == [
        ("user", "one"), ("assistant", "two"), ("user", "again")]


def test_history_survives_a_new_store_on_the_same_file(tmp_path: Path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    conv = store.create_conversation("Kept")
    store.add_message(conv.id, "user", "remember me")
    store.close()
    again = ChatStore(path)
    assert [c.title for c in again.list_conversations()] == ["Kept"]
    assert [m.content for m in again.messages(conv.id)] == ["remember me"]


def test_streamed_text_is_on_disk_before_the_answer_ends(tmp_path: Path):
    """Crash safety: another connection (as after a crash) sees the text so far."""
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    conv = store.create_conversation("Crash")
    store.add_message(conv.id, "user", "tell me")
    answer = store.add_message(conv.id, "assistant", "", state="streaming")
    now = [0.0]
    writer = StreamWriter(store, answer.id, interval_s=0.1, every=1000, clock=lambda: now[0])
    for i in range(5):
        writer.append(f"piece{i} ")
        now[0] += 0.03  # pieces 30 ms apart: a write every ~100 ms, not every piece
    assert writer.writes == 1

    other = sqlite3.connect(str(path))  # a reader that shares nothing with the writer
    content, state = other.execute("SELECT content, state FROM messages WHERE id = ?",
                                   (answer.id,)).fetchone()
    assert state == "streaming"
    assert content.startswith("piece0 piece1 piece2 piece3")
    assert message_of(ChatStore(path), answer.id).state == "streaming"  # shown as interrupted

    writer.finish("done", tokens=5, prompt_tokens=9)
    content, state = other.execute("SELECT content, state FROM messages WHERE id = ?",
                                   (answer.id,)).fetchone()
    assert (content, state) == ("piece0 piece1 piece2 piece3 piece4 ", "done")



def test_a_reasoning_models_thoughts_are_saved_apart_from_the_answer(tmp_path: Path):
    store = ChatStore(tmp_path / "chats.db")
    conv = store.create_conversation("thinking")
    answer = store.add_message(conv.id, "assistant", state="streaming")
    writer = StreamWriter(store, answer.id, interval_s=3600, every=2)
    writer.append_thought("Two plus ")
    writer.append_thought("two is four.")  # the second piece writes
    on_disk = store.message(answer.id)
    assert on_disk is not None and on_disk.thoughts == "Two plus two is four."
    assert on_disk.content == ""
    writer.append("Four.")
    writer.finish("done")
    done = store.message(answer.id)
    assert done is not None and (done.content, done.thoughts) == ("Four.", "Two plus two is four.")
    markdown = store.export_markdown(conv.id)
    assert "<summary>Thinking</summary>" in markdown and markdown.rstrip().endswith("Four.")
    store.close()


def test_a_file_from_before_thoughts_opens_and_keeps_its_messages(tmp_path: Path):
    path = tmp_path / "chats.db"
    store = ChatStore(path)
    conv = store.create_conversation("old")
    store.add_message(conv.id, "user", "hello")
    store.close()
    db = sqlite3.connect(path)  # what a version-2 file looks like: no thoughts column
    db.execute("ALTER TABLE messages DROP COLUMN thoughts")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    reopened = ChatStore(path)
    (message,) = reopened.messages(conv.id)
    assert message.content == "hello" and message.thoughts == ""
    reopened.close()

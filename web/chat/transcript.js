// What the Chat view shows: the list of kept conversations and the open one's turns (user
// messages as text with an Edit button, answers as escaped Markdown with Regenerate on the
// last one). Nothing here runs a job: the buttons call the handlers the view passes in.

import { countOf } from "../view_common.js";
import { formattedJson, showJsonAnswer } from "../structured_output.js";
import { renderMarkdown } from "./markdown.js";

const ROLE_LABELS = { user: "You", assistant: "Assistant" };

function button(text, className, onClick, label) {
  const node = document.createElement("button");
  node.type = "button";
  node.className = className;
  node.textContent = text;
  if (label) node.setAttribute("aria-label", label);
  node.addEventListener("click", onClick);
  return node;
}

// The conversations, newest first: open one by its title, delete it with its × button. A
// conversation just deleted (`removed`: store.remove's answer) keeps its place as a line
// "Deleted “…”. Undo" until the next change, so a slip of the mouse costs nothing.
export function renderList(listNode, store, { onOpen, onDelete, disabled, removed = null, onUndo }) {
  const items = store.conversations.map((conversation) => {
    const li = document.createElement("li");
    li.dataset.id = conversation.id;
    if (conversation.id === store.currentId) li.setAttribute("aria-current", "true");
    const open = button(conversation.title || "New chat", "chat-open", () => onOpen(conversation.id));
    open.disabled = disabled;
    const remove = button("×", "chat-delete", () => onDelete(conversation.id), `Delete the chat “${conversation.title}”`);
    remove.disabled = disabled;
    li.append(open, remove);
    return li;
  });
  if (removed) {
    const li = document.createElement("li");
    li.className = "chat-removed";
    const title = removed.conversation.title || "New chat";
    const text = document.createElement("span");
    text.textContent = `Deleted “${title}”.`;
    const undo = button("Undo", "chat-undo-delete", onUndo, `Undo: bring back the chat “${title}”`);
    undo.disabled = disabled;
    li.append(text, undo);
    items.splice(Math.min(removed.index, items.length), 0, li);
  }
  listNode.replaceChildren(...items);
}

// One message: its role, its text (answers as Markdown), and its action buttons.
export function messageNode(message, index, { canEdit, canRegenerate, onEdit, onRegenerate }) {
  const li = document.createElement("li");
  li.className = `chat-message chat-${message.role}`;
  li.dataset.index = String(index);
  const role = document.createElement("span");
  role.className = "chat-role";
  role.textContent = ROLE_LABELS[message.role] || message.role;
  const body = document.createElement("div");
  body.className = "chat-body";
  if (message.role === "assistant") {
    // An answer that is a JSON object (Answer as JSON) is shown formatted, the rest as Markdown.
    if (message.content.trimStart().startsWith("{") && formattedJson(message.content) !== null) showJsonAnswer(body, message.content);
    else renderMarkdown(body, message.content);
  } else {
    body.textContent = message.content;
  }
  li.append(role, body);
  const actions = document.createElement("div");
  actions.className = "chat-actions";
  if (message.role === "user" && canEdit) actions.append(button("Edit", "chat-edit", () => onEdit(index), `Edit message ${index + 1}`));
  if (canRegenerate) actions.append(button("Regenerate", "chat-regenerate", onRegenerate, "Regenerate the last answer"));
  if (actions.childElementCount) li.append(actions);
  return li;
}

// The open conversation's turns; `busy` hides the buttons while a turn runs.
export function renderTurns(turnsNode, conversation, { busy, onEdit, onRegenerate }) {
  const last = conversation.messages.length - 1;
  const nodes = conversation.messages.map((message, index) => messageNode(message, index, {
    canEdit: !busy,
    canRegenerate: !busy && index === last && message.role === "assistant",
    onEdit,
    onRegenerate,
  }));
  turnsNode.replaceChildren(...nodes);
}

// The status line's account of a turn's prompt pass: how many of its tokens ran and how many
// the KV cache kept from the previous turn; where the backend cannot reuse a prefix exactly the
// worker sends `reuseNote` (why), and the line says every token ran.
export function describePrompt({ newTokens, reusedTokens, reuseNote = null }) {
  const total = newTokens + reusedTokens;
  if (reuseNote) return `Prompt: ${countOf(total, "token")}, all read again (no reuse on this backend).`;
  return `Prompt: ${countOf(total, "token")}: ${newTokens} new, ${reusedTokens} reused from the cache.`;
}

// The answer so far: its tokens and decode speed (tokens after the first, per second).
export function describeAnswer(tokens, tokensPerSecond) {
  return `Answer: ${countOf(tokens, "token")} · ${tokensPerSecond > 0 ? tokensPerSecond.toFixed(1) : "–"} tok/s`;
}

// The answer being streamed: a message node whose body is re-rendered as text arrives.
export function streamingNode(turnsNode) {
  const node = messageNode({ role: "assistant", content: "" }, -1, { canEdit: false, canRegenerate: false });
  node.classList.add("chat-streaming");
  turnsNode.append(node);
  const body = node.querySelector(".chat-body");
  return (text) => {
    renderMarkdown(body, text);
    node.scrollIntoView({ block: "end" });
  };
}

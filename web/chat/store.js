// The Chat view's conversations, kept in this tab's localStorage across reloads: a list of
// {id, title, system, messages: [{role, content}], model, settings, updated}, and which one is
// open (`model`: the registry name its turns ran on; `settings`: the form's numbers as typed,
// {"chat-max-tokens": "256", ...}; both null in chats saved before they were kept). Export
// and import use OpenAI's messages format: [{role: "system"|"user"|"assistant", content}],
// a system message first if there is one.

const STORAGE_KEY = "candle-web.chat.v1";
const ROLES = new Set(["system", "user", "assistant"]);
const TITLE_CHARS = 48;
export const MAX_IMPORT_BYTES = 8 * 1024 * 1024;

function newId() {
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

export function titleOf(conversation) {
  const first = conversation.messages.find((m) => m.role === "user");
  const text = (first?.content || "New chat").replace(/\s+/g, " ").trim();
  return text.length > TITLE_CHARS ? `${text.slice(0, TITLE_CHARS - 1)}…` : text;
}

// OpenAI messages -> {system, messages}; throws an Error naming the bad entry.
export function fromOpenAi(data) {
  if (!Array.isArray(data)) throw new Error("expected a JSON list of {role, content} messages");
  let system = "";
  const messages = [];
  data.forEach((message, index) => {
    if (message === null || typeof message !== "object") throw new Error(`message ${index}: expected an object with role and content`);
    const { role, content } = message;
    if (!ROLES.has(role)) throw new Error(`message ${index}: role ${JSON.stringify(role)} is not system, user or assistant`);
    if (typeof content !== "string") throw new Error(`message ${index}: content must be a string`);
    if (role === "system") {
      if (index !== 0) throw new Error(`message ${index}: a system message may only come first`);
      system = content;
    } else {
      messages.push({ role, content });
    }
  });
  return { system, messages };
}

export function toOpenAi(conversation) {
  const head = conversation.system ? [{ role: "system", content: conversation.system }] : [];
  return [...head, ...conversation.messages.map(({ role, content }) => ({ role, content }))];
}

export class ChatStore {
  constructor(storage = globalThis.localStorage) {
    this.storage = storage;
    this.conversations = [];
    this.currentId = null;
    this.load();
  }

  load() {
    try {
      const saved = JSON.parse(this.storage?.getItem(STORAGE_KEY) || "null");
      if (saved && Array.isArray(saved.conversations)) {
        this.conversations = saved.conversations.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages));
        this.currentId = saved.currentId;
      }
    } catch (error) {
      console.warn("saved chats unreadable, starting afresh:", error);
    }
    if (!this.current()) this.create();
  }

  save() {
    try {
      this.storage?.setItem(STORAGE_KEY, JSON.stringify({ conversations: this.conversations, currentId: this.currentId }));
    } catch (error) {
      console.warn("chats not saved (storage full or blocked):", error); // the view keeps working
    }
  }

  current() {
    return this.conversations.find((c) => c.id === this.currentId) || null;
  }

  create({ system = "", messages = [], model = null, settings = null } = {}) {
    const conversation = { id: newId(), title: "", system, messages, model, settings, updated: Date.now() };
    conversation.title = titleOf(conversation);
    this.conversations.unshift(conversation);
    this.currentId = conversation.id;
    this.save();
    return conversation;
  }

  open(id) {
    if (this.conversations.some((c) => c.id === id)) this.currentId = id;
    this.save();
  }

  // Removes a conversation; returns what restore() needs to put it back (Undo), or null.
  remove(id) {
    const index = this.conversations.findIndex((c) => c.id === id);
    if (index < 0) return null;
    const [conversation] = this.conversations.splice(index, 1);
    const wasCurrent = this.currentId === id;
    if (wasCurrent) this.currentId = this.conversations[0]?.id ?? null;
    // The last one gone: an empty chat takes its place (Undo drops it again if still empty).
    const created = this.current() ? null : this.create().id;
    this.save();
    return { conversation, index, wasCurrent, created };
  }

  restore({ conversation, index, wasCurrent, created }) {
    const placeholder = this.conversations.find((c) => c.id === created);
    if (placeholder && placeholder.messages.length === 0) {
      this.conversations = this.conversations.filter((c) => c !== placeholder);
    }
    this.conversations.splice(Math.min(index, this.conversations.length), 0, conversation);
    if (wasCurrent || !this.current()) this.currentId = conversation.id;
    this.save();
  }

  // Saves the open conversation after a change (its title follows its first message).
  touch(conversation = this.current()) {
    conversation.updated = Date.now();
    conversation.title = titleOf(conversation);
    this.save();
  }
}

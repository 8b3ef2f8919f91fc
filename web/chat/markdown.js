// Markdown for the Chat view's answers, built as DOM nodes: every piece of model text becomes
// a text node (never innerHTML), so "<script>" or "<img onerror=...>" in an answer shows as
// text and runs nothing. The subset chat models write: paragraphs, #-headings, "-"/"*"/"1."
// lists, ``` fenced code blocks (with a copy button), `inline code`, **bold** and *italic*.

const FENCE = /^\s*```\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
// Inline spans, tried left to right: code first (its content is literal), then bold, italic.
const INLINE = /(`+)([^`]+?)\1|\*\*([^*]+?)\*\*|__([^_]+?)__|\*([^*\s][^*]*?)\*/g;

function element(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

// Appends `text` with its inline spans to `parent`, as text nodes and elements only.
export function appendInline(parent, text) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) parent.append(document.createTextNode(text.slice(last, match.index)));
    const [, , code, bold, boldAlt, italic] = match;
    let node;
    if (code !== undefined) {
      node = element("code");
      node.textContent = code;
    } else if (bold !== undefined || boldAlt !== undefined) {
      node = element("strong");
      appendInline(node, bold ?? boldAlt);
    } else {
      node = element("em");
      appendInline(node, italic);
    }
    parent.append(node);
    last = match.index + match[0].length;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

// A code block with its language label and a copy button (the clipboard gets the raw text).
function codeBlock(code, language) {
  const figure = element("figure", "code-block");
  const bar = element("div", "code-bar");
  const label = element("span", "code-language");
  label.textContent = language || "code";
  const copy = element("button", "code-copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", `Copy the ${language || "code"} block`);
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code);
      copy.textContent = "Copied";
    } catch {
      copy.textContent = "Copy failed";
    }
    setTimeout(() => { copy.textContent = "Copy"; }, 1500);
  });
  bar.append(label, copy);
  const pre = element("pre");
  const codeNode = element("code");
  codeNode.textContent = code;
  pre.append(codeNode);
  figure.append(bar, pre);
  figure.dataset.code = code;
  return figure;
}

// Splits the lines into blocks: {type: "code"|"heading"|"list"|"paragraph", ...}. An open
// fence (an answer still streaming, or cut by the token limit) runs to the end.
export function parseBlocks(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const blocks = [];
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) blocks.push({ type: "paragraph", text: paragraph.join("\n") });
    paragraph = [];
  };
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      flush();
      const code = [];
      for (i += 1; i < lines.length && !FENCE.test(lines[i]); i += 1) code.push(lines[i]);
      blocks.push({ type: "code", language: fence[1], text: code.join("\n") });
      continue;
    }
    const heading = line.match(HEADING);
    const item = line.match(BULLET) || line.match(NUMBERED);
    if (heading) {
      flush();
      blocks.push({ type: "heading", level: heading[1].length, text: heading[2] });
    } else if (item) {
      flush();
      const ordered = !BULLET.test(line);
      const previous = blocks[blocks.length - 1];
      if (previous?.type === "list" && previous.ordered === ordered) previous.items.push(item[1]);
      else blocks.push({ type: "list", ordered, items: [item[1]] });
    } else if (line.trim() === "") {
      flush();
      blocks.push({ type: "break" });
    } else {
      paragraph.push(line);
    }
  }
  flush();
  return blocks.filter((block) => block.type !== "break");
}

// Replaces `container`'s children with the rendered answer.
export function renderMarkdown(container, text) {
  const nodes = parseBlocks(text).map((block) => {
    if (block.type === "code") return codeBlock(block.text, block.language);
    if (block.type === "heading") {
      const node = element(`h${Math.min(block.level + 3, 6)}`);
      appendInline(node, block.text);
      return node;
    }
    if (block.type === "list") {
      const list = element(block.ordered ? "ol" : "ul");
      for (const item of block.items) {
        const li = element("li");
        appendInline(li, item);
        list.append(li);
      }
      return list;
    }
    const p = element("p");
    block.text.split("\n").forEach((line, index) => {
      if (index > 0) p.append(element("br"));
      appendInline(p, line);
    });
    return p;
  });
  container.replaceChildren(...nodes);
}

"""`candle-web chat`: an interactive terminal chat on one LLaMA-family model.

Each answer streams as it is generated; the KV cache carries over between turns
(generation/conversation.py), so a turn processes only the tokens the cache does not hold, and
a line after each answer says how many were new and how many reused (on a backend whose steps do
not split a prompt exactly, numpy, none are: the start says so). Ctrl-C stops the current
answer (what was said stays in the conversation) and returns to the prompt; Ctrl-D exits.

Commands (a line starting with "/"):
    /reset          forget the conversation (the system prompt stays)
    /system TEXT    set the system prompt (/system alone removes it)
    /save FILE      write the conversation as OpenAI messages JSON
    /load FILE      read a conversation in that format (what /save wrote)
    /regen          answer the last message again
    /help           this list
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .core.errors import CandleError

HELP = """commands: /reset, /system TEXT, /save FILE, /load FILE, /regen, /help
Ctrl-C stops the current answer; Ctrl-D exits"""
PROMPT = "> "
MAX_LOAD_BYTES = 16 * 1024 * 1024


class TerminalChat:
    """The loop: read a line, run a command or a turn, print. `out` gets the answers,
    `info` the status lines (stderr), so an answer can be piped on its own."""

    def __init__(self, conversation, options, out=None, info=None):
        self.chat, self.options = conversation, options
        self.out = out or sys.stdout
        self.info = info or sys.stderr

    def say(self, text: str) -> None:
        self.info.write(text + "\n")
        self.info.flush()

    def run(self, read_line=input) -> int:
        self.say(f"chat with {self.describe()}; /help for commands, Ctrl-D exits")
        if self.chat.reuse_note is not None:
            self.say(f"[{self.chat.reuse_note}]")
        while True:
            try:
                line = read_line(PROMPT)
            except EOFError:
                self.out.write("\n")
                return 0
            except KeyboardInterrupt:  # at the prompt: a fresh line, not an exit
                self.say("\n(Ctrl-D exits)")
                continue
            try:
                self.handle(line)
            except KeyboardInterrupt:
                self.say("\n[stopped]")
            except CandleError as error:
                self.say(f"candle-web: {error}")

    def describe(self) -> str:
        context = self.chat.context_length
        return f"a context of {context} tokens" if context else "the model"

    def handle(self, line: str) -> None:
        text = line.strip()
        if not text:
            return
        if text.startswith("/"):
            self.command(text)
        else:
            self.turn(lambda on_event: self.chat.send(line, self.options, on_event))

    def command(self, text: str) -> None:
        name, _, arg = text.partition(" ")
        arg = arg.strip()
        if name == "/reset":
            self.chat.reset()
            self.say("[conversation cleared]")
        elif name == "/system":
            self.chat.set_system(arg or None)
            self.say(f"[system prompt {'set' if arg else 'removed'}]")
        elif name == "/save" and arg:
            Path(arg).expanduser().write_text(self.chat.to_json() + "\n", encoding="utf-8")
            self.say(f"[saved {len(self.chat.openai_messages())} messages to {arg}]")
        elif name == "/load" and arg:
            self.load(Path(arg).expanduser())
        elif name in ("/regen", "/regenerate"):
            self.turn(lambda on_event: self.chat.regenerate(self.options, on_event))
        elif name == "/help":
            self.say(HELP)
        else:
            self.say(f"unknown command {name!r} (or a missing argument); {HELP}")

    def load(self, path: Path) -> None:
        try:
            if path.stat().st_size > MAX_LOAD_BYTES:
                raise CandleError(f"{path}: larger than {MAX_LOAD_BYTES} bytes")
            messages = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CandleError(f"/load {path}: {error}") from None
        self.chat.load_messages(messages, where=str(path))
        self.say(f"[loaded {len(self.chat.messages)} messages"
                 f"{' and a system prompt' if self.chat.system else ''} from {path}]")
        for message in self.chat.messages:
            self.out.write(f"{message['role']}: {message['content']}\n")
        self.out.flush()

    def turn(self, run) -> None:
        def on_event(kind, payload):
            if kind == "prompt" and payload.get("notice"):
                self.say(f"[{payload['notice']}]")
            elif kind == "token" and payload["text"]:
                self.out.write(payload["text"])
                self.out.flush()

        turn = run(on_event)
        self.out.write("\n")
        self.out.flush()
        result = turn.result
        speed = f", {result.tokens_per_second:.1f} tok/s" if result is not None else ""
        self.say(f"[prompt: {turn.new_tokens} new tokens, {turn.reused_tokens} reused; "
                 f"{len(turn.token_ids)} generated{speed}; {turn.stop_reason}]")


def cmd_chat(args) -> int:
    from .generation import GenerationOptions
    from .generation.conversation import Conversation
    from .pipelines import load_llama
    from .pipelines.arguments import apply_compute_type

    apply_compute_type(args)
    loaded = load_llama(args.model, progress=args.download_progress())
    options = GenerationOptions(max_new_tokens=args.max_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                add_special_tokens=False)
    conversation = Conversation(loaded.model, loaded.tokenizer, system=args.system,
                                context_length=args.context)
    try:
        import readline  # noqa: F401  (line editing and history for input(), where available)
    except ImportError:
        pass
    return TerminalChat(conversation, options).run()


def add_chat_command(sub, sampling_arguments, text_argument, download_progress,
                     compute_type_argument):
    """`candle-web chat`, registered by cli.build_parser with its shared argument helpers."""
    from .generation.option_limits import Limit

    c = sub.add_parser("chat", help="an interactive multi-turn chat in the terminal")
    c.add_argument("--model", default="smollm2-135m-instruct",
                   help="registry name, a .gguf file or an HF model folder")
    c.add_argument("--system", default=None, type=text_argument("--system"),
                   help="the system prompt")
    c.add_argument("--context", type=Limit(integer=True, minimum=1).argparse_type(), default=None,
                   help="tokens of context at most (default: the model's); older turns are "
                        "dropped, with a notice, to fit")
    sampling_arguments(c, max_tokens=512)
    compute_type_argument(c)
    c.set_defaults(func=cmd_chat, download_progress=download_progress)

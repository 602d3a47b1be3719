"""How the scripted model speaks to an agent: the workload's step, said in the agent's own dialect.

The forms below are the same in every API the endpoint speaks: Chat Completions (fleet/model_endpoint.py),
Anthropic Messages (fleet/dialect_messages.py) and OpenAI Responses (fleet/dialect_responses.py), each of which
reads its request into the chat form this module reads.

The step script, the grader and what a step does stay the workload's; only the form of the answer changes.

- `tools`: the request declares the workload's tools (`apply_patch`, `publish`, ...): the answer is a call of one.
- `shell`: the request declares one command-style tool (a function whose one required parameter is a string, such
  as `bash`, `shell`, `execute_bash`, `run_command`, `python` or `code`, or an argv: Codex CLI's `shell`, answered
  `["sh", "-c", command]`): the answer is a call of that tool with a POSIX shell command that does the step
  (python3 for what the shell cannot say: the effects POST, a multi-file edit; nothing else is assumed in the
  sandbox).
- `text`: the request declares no tools and its instructions show a fenced code block (or the dialect is pinned):
  the answer is assistant text with exactly one fenced bash block (as mini-swe-agent and aider-like agents parse
  it); after the last step, the agent's own finish action. A request with no tools and no such instructions is a
  runner of the contract's first form and gets the workload's tool calls.

The step number comes from the conversation: tool results for `tools` and `shell`, observation turns (a user or
tool message after an assistant turn) for `text`. So a resumed conversation is asked for the same next step.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from fleet.workloads.base import ToolStep

DIALECTS = ("tools", "shell", "text")
COMMAND_NAMES = ("bash", "shell", "execute_bash", "run_command", "run_shell_command", "terminal", "python", "code",
                 "execute", "exec", "cmd", "command", "sh", "shell_command", "exec_command")
DEFAULT_FINISH = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class DialectError(ValueError):
    """The request cannot be served in any dialect (a 400 naming why)."""


@dataclass(frozen=True)
class Dialect:
    kind: str  # tools | shell | text
    tool: str | None = None  # shell: the command tool's name
    param: str | None = None  # shell: its string parameter
    argv: bool = False  # shell: the parameter is an argv (an array of strings: Codex CLI's `shell` tool)
    fence: str = "bash"  # text: the info string of the block the agent's instructions show (```mswea_bash_command)


def _functions(body: dict) -> list[dict]:
    out = []
    for t in body.get("tools") or []:
        if isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(t.get("function"), dict):
            out.append(t["function"])
    for f in body.get("functions") or []:  # the legacy `functions` field
        if isinstance(f, dict):
            out.append(f)
    return out


def _is_argv(schema) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "array" and isinstance(schema.get("items"), dict) \
        and schema["items"].get("type") == "string"


def _command_param(fn: dict) -> str | None:
    """The one required string (or argv: array of strings) parameter of a command-style tool, or None."""
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = params.get("required") or [k for k in props][:1]
    if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
        return None
    strings = [k for k in required if isinstance(props.get(k), dict) and (props[k].get("type") == "string"
                                                                          or _is_argv(props[k]))]
    return strings[0] if len(strings) == 1 and len(required) == 1 else None


def detect(body: dict, workload_tools: set[str], pinned: str | None = None) -> tuple[Dialect, str | None]:
    """The dialect of a chat request, and a note when a pinned dialect disagrees with what the agent sent. Raises
    DialectError when no dialect can serve it."""
    fns = _functions(body)
    names = {f.get("name") for f in fns}
    seen: Dialect
    if not fns:  # no tools: a text agent when its prompt shows a fenced block, else the contract's tool calls
        fence = _fence_asked(body.get("messages") or [])
        seen = Dialect("text", fence=fence or "bash") if pinned == "text" or fence else Dialect("tools")
    elif workload_tools and workload_tools <= names:
        seen = Dialect("tools")
    else:
        commands = [(f["name"], p) for f in fns if isinstance(f.get("name"), str) for p in [_command_param(f)] if p]
        if not commands:
            raise DialectError(f"the request declares tools {sorted(n for n in names if n)} but neither the "
                               f"workload's ({', '.join(sorted(workload_tools))}) nor a command-style tool (a "
                               "function with one required string parameter): nothing to answer a step with")
        if len(commands) > 1:
            hinted = [c for c in commands if c[0].lower() in COMMAND_NAMES]
            if len(hinted) != 1:
                raise DialectError(f"the request declares {len(commands)} command-style tools "
                                   f"({', '.join(c[0] for c in commands)}) and none is the one shell tool by name "
                                   f"({', '.join(COMMAND_NAMES[:6])}, ...): pin one with model.dialect: shell and "
                                   "give the agent one shell tool")
            commands = hinted
        fn = next(f for f in fns if f.get("name") == commands[0][0])
        seen = Dialect("shell", commands[0][0], commands[0][1],
                       argv=_is_argv(fn["parameters"]["properties"][commands[0][1]]))
    if pinned and pinned != seen.kind:
        return seen, f"model.dialect is pinned to {pinned!r} but the agent sent a {seen.kind!r} request"
    return seen, None


_FENCE = re.compile(r"```([A-Za-z0-9_.+-]*)")


def _fence_asked(messages: list) -> str | None:
    """The info string of the fenced block the agent's own instructions (its first messages) show, "" for a bare
    fence, None when they show none: a text-protocol agent always says how its actions are written
    (mini-swe-agent 2.x: ```mswea_bash_command). A runner that declares no tools and shows no fence gets the
    workload's tool calls."""
    for m in messages[:3]:
        c = m.get("content") if m.get("role") in ("system", "developer", "user") else None
        text = c if isinstance(c, str) else " ".join(p.get("text", "") for p in c if isinstance(p, dict)) \
            if isinstance(c, list) else ""
        found = _FENCE.search(text)
        if found:
            return found.group(1) or "bash"
    return None


# The whole text of a tool result an agent wrote for a call whose output it lost: Codex CLI normalizes its history
# on resume by giving every call without an output the output "aborted". A real model asks for such a call again,
# so the scripted one does too: it is no finished step.
ABORTED = "aborted"


def tool_step_done(m: dict) -> bool:
    """Is this message a tool result that finishes a step (not an agent's mark of a call it lost)?"""
    c = m.get("content")
    return m.get("role") in ("tool", "function") and not (isinstance(c, str) and c.strip().lower() == ABORTED)


def step_of(messages: list, dialect: Dialect) -> int:
    """How many steps the conversation already holds."""
    if dialect.kind != "text":
        return sum(1 for m in messages if tool_step_done(m))
    n, after_assistant = 0, False
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            after_assistant = True
        elif role in ("user", "tool", "function") and after_assistant:
            n += 1
            after_assistant = False
    return n


def _py(code: str) -> str:
    return "python3 -c " + shlex.quote(code)


def command(step: ToolStep) -> str:
    """A shell command that does the step as the workload's tool would (docs/runner-contract.md)."""
    a = step.arguments
    if step.tool == "apply_patch":
        path = a["path"]
        d = path.rsplit("/", 1)[0] if "/" in path else ""
        mk = f'mkdir -p "$SANDFLEET_REPO"/{shlex.quote(d)} && ' if d else ""
        return f'{mk}printf "%s\\n" {shlex.quote(a["append"])} >> "$SANDFLEET_REPO"/{shlex.quote(path)}'
    if step.tool == "publish":
        payload = json.dumps({k: a[k] for k in ("effect_id", "channel", "text")})
        return _py("import json,os,urllib.request as u\n"
                   f"b={payload!r}.encode()\n"
                   "r=u.Request(os.environ['SANDFLEET_EFFECTS_URL'].rstrip('/')+'/effects',data=b,method='POST',"
                   "headers={'Content-Type':'application/json',"
                   "'Authorization':'Bearer '+os.environ['SANDFLEET_EFFECTS_KEY']})\n"
                   "print(u.urlopen(r,timeout=60).read().decode())")
    if step.tool == "apply_edits":
        return _py("import json,os\n"
                   f"edits=json.loads({json.dumps(a['edits'])!r})\n"
                   "done=[]\n"
                   "for e in edits:\n"
                   " p=os.path.join(os.environ['SANDFLEET_REPO'],e['path'])\n"
                   " s=open(p).read()\n"
                   " if e['old'] in s:\n"
                   "  open(p,'w').write(s.replace(e['old'],e['new'])); done.append(e['path'])\n"
                   "print('edited',len(done),'of',len(edits),'files:',', '.join(done))")
    if step.tool == "run_command":
        return f'cd "$SANDFLEET_REPO" && {a["command"]}'
    if step.tool == "run_tests":
        return 'find "$SANDFLEET_REPO" -type f | wc -l'
    raise DialectError(f"the workload's tool {step.tool!r} has no shell form")


def tool_call_arguments(step: ToolStep, dialect: Dialect) -> tuple[str, dict]:
    """(function name, arguments) of the answer's tool call."""
    if dialect.kind == "shell":
        return dialect.tool, {dialect.param: ["sh", "-c", command(step)] if dialect.argv else command(step)}
    return step.tool, step.arguments


def text_answer(step: ToolStep, fence: str = "bash") -> str:
    return f"THOUGHT: step {step.step + 1}: {step.tool.replace('_', ' ')}.\n\n```{fence}\n{command(step)}\n```"


def text_final(final: str, finish: str | None, fence: str = "bash") -> str:
    return f"THOUGHT: {final}\n\n```{fence}\n{finish or DEFAULT_FINISH}\n```"

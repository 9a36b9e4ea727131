"""The reference side of the chat template tests: Jinja2 configured as Hugging Face transformers
configures it for chat templates (transformers' chat template utilities, 4.4x):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[<generation tag>, jinja2.ext.loopcontrols])
  filters["tojson"]   = json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=)
  globals["raise_exception"](message) raises TemplateError(message)
  globals["strftime_now"](fmt)        = datetime.now().strftime(fmt)

{% generation %}...{% endgeneration %} is a call block whose result is its body, as transformers'
AssistantTracker renders it when it is not tracking (a body is a scope, as any call block).

`now_unix_micros` fixes what strftime_now sees (the local time zone; the tests run with TZ=UTC).
"""

import copy
import datetime
import json

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}body{% endgeneration %} renders body (transformers' AssistantTracker)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def make_environment(now_unix_micros=None):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception

    def strftime_now(fmt):
        if now_unix_micros is None:
            now = datetime.datetime.now()
        else:
            now = datetime.datetime.fromtimestamp(now_unix_micros / 1e6)
        return now.strftime(fmt)

    env.globals["strftime_now"] = strftime_now
    return env


def render(template, context, now_unix_micros=None):
    """{"ok": True, "output": str} or {"ok": False, "error": "<ExceptionType>: message"}."""
    try:
        env = make_environment(now_unix_micros)
        # A copy: Jinja2 can change a context's lists in place (list.pop passes its sandbox, and
        # the indent filter extends a list it is given), which must not reach later renders.
        out = env.from_string(template).render(**copy.deepcopy(context))
        return {"ok": True, "output": out}
    except RecursionError as e:  # Jinja2 has no depth limit of its own
        return {"ok": False, "error": f"RecursionError: {e}"}
    except Exception as e:  # noqa: BLE001 -- any exception of the template is "it raised"
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


# Special tokens as transformers' special_tokens_map passes them to the template: each attribute
# whose value is set (a string, or an AddedToken object's "content"), nothing for null or absent.
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                      "mask_token")


def _token_text(v):
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) and v else None


def special_tokens(tokenizer_config):
    out = {}
    for k in SPECIAL_TOKEN_KEYS:
        t = _token_text(tokenizer_config.get(k))
        if t is not None:
            out[k] = t
    extra = tokenizer_config.get("additional_special_tokens")
    if isinstance(extra, list):
        texts = [t for t in (_token_text(v) for v in extra) if t is not None]
        if texts:
            out["additional_special_tokens"] = texts
    return out


def select_template(tokenizer_config, chat_template_jinja="", has_tools=False):
    """The template transformers picks: chat_template.jinja when the folder has one, else the
    config's string, else from its named list the "tool_use" entry for a request with tools and
    the "default" one otherwise. None when there is none."""
    if chat_template_jinja:
        return chat_template_jinja
    ct = tokenizer_config.get("chat_template")
    if isinstance(ct, str):
        return ct
    if isinstance(ct, list):
        named = {e.get("name"): e.get("template") for e in ct if isinstance(e, dict)}
        if has_tools and "tool_use" in named:
            return named["tool_use"]
        return named.get("default")
    return None


def chat_context(tokenizer_config, messages, tools=None, add_generation_prompt=False, kwargs=None):
    """The variables transformers' apply_chat_template renders with."""
    ctx = {
        "messages": messages,
        "tools": tools,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
    }
    ctx.update(special_tokens(tokenizer_config))
    ctx.update(kwargs or {})
    return ctx


def render_chat(tokenizer_config, messages, tools=None, add_generation_prompt=False, kwargs=None,
                now_unix_micros=None, chat_template_jinja=""):
    template = select_template(tokenizer_config, chat_template_jinja, has_tools=tools is not None)
    if template is None:
        return {"ok": False, "error": "no chat template"}
    ctx = chat_context(tokenizer_config, messages, tools, add_generation_prompt, kwargs)
    return render(template, ctx, now_unix_micros)

"""Secrets outside cluster.env: refused where they would land in a file or on a command line,
and `${NAME}` env values taken from the launcher's shell.

cluster.env is the one place a secret may live: mlaunch masks its secret-named values in
everything it prints and sends them to the nodes in no argv and no file (render.bootstrap).
A token in passthrough lands in llamafactory.yaml / on `swift sft`'s command line; one in
script.args lands on torchrun's.
"""
from __future__ import annotations

import os
import re
import shlex

from ..errors import Problem
from .env_refs import literal, literal_of
from .explain import SECRET_NAME

# The last word of a key or flag (split at _ - .) that names a secret. Only the last word:
# calculate_per_token_loss and --max-new-tokens count tokens, hf_hub_token is one.
_SECRET_WORDS = {"token", "secret", "password", "passwd", "credential", "credentials", "cookie",
                 "apikey"}
# The variable each trainer (or its hub library) reads in place of a secret argument.
ENV_FOR = {"hf_hub_token": "HF_TOKEN", "push_to_hub_token": "HF_TOKEN",
           "ms_hub_token": "MODELSCOPE_API_TOKEN", "om_hub_token": "OPENMIND_HUB_TOKEN",
           "hub_token": "HF_TOKEN",
           "swanlab_api_key": "SWANLAB_API_KEY", "wandb_api_key": "WANDB_API_KEY"}
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# scheme://user:password@host: the password, whatever the variable's name.
URL_CREDS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)([^\s/@]+)(@)")
_ASSIGN = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=")


def secret_name(name: str) -> bool:
    """Whether a passthrough key or a command-line flag names a secret value."""
    words = [w for w in re.split(r"[_.\-]+", name.lower().lstrip("-")) if w]
    return bool(words) and (words[-1] in _SECRET_WORDS or words[-2:] == ["api", "key"])


def check_passthrough_secrets(passthrough: dict, trainer: str) -> list[Problem]:
    """A secret-named passthrough key would be written into the trainer's config or argv."""
    where = "llamafactory.yaml" if trainer == "LLaMA-Factory" else "ms-swift's command line"
    out = []
    for key in passthrough:
        if isinstance(key, str) and secret_name(key):
            env = ENV_FOR.get(key, key.upper())
            if key == "hub_token" and trainer == "ms-swift":
                env = "MODELSCOPE_API_TOKEN, or HF_TOKEN with use_hf"
            out.append(Problem(f"passthrough.{key}", f"a secret here lands in {where} and the dry "
                               f"run; remove it and put it in cluster.env (e.g. {env}: ..., which "
                               f"{trainer} reads), which mlaunch sends on no command line and in "
                               "no file"))
    return out


def check_script_secrets(args: list[str]) -> list[Problem]:
    """An argument after a secret-named flag (or --flag=value), or a URL with a password, would
    show on torchrun's and the rank's argv: /proc/<pid>/cmdline, which every user can read."""
    out = []
    for i, arg in enumerate(args):
        if URL_CREDS.search(arg):
            out.append(Problem(f"script.args[{i}]", "a URL with a password would show on torchrun's "
                               "and the rank's command line (/proc/<pid>/cmdline, readable by every "
                               "user); put the URL in cluster.env (e.g. DATA_URL: ${DATA_URL}, "
                               "exported in this shell) and read it in the script (os.environ)"))
            continue
        flag, eq, _ = arg.partition("=")
        after = i > 0 and args[i - 1].startswith("-") and "=" not in args[i - 1] \
            and secret_name(args[i - 1]) and not arg.startswith("-")
        if (eq and flag.startswith("-") and secret_name(flag)) or after:
            name = flag if eq else args[i - 1]
            out.append(Problem(f"script.args[{i}]", f"the value of {name} would show on torchrun's "
                               "command line (ps, logs); put it in cluster.env and read it from "
                               "the environment in the script (os.environ)"))
    return out


# The launcher-shell variables a spec's `${NAME}` values were read from (MY_HF for HF_TOKEN:
# ${MY_HF}): secrets under names of the user's choosing, kept out of what Slurm's clients
# export (backends/slurm/commands.py client_env). One job per mlaunch process; a detached run's
# supervisor is told them (its spec arrives resolved).
REF_SOURCES: set[str] = set()


def resolve_env_refs(raw: dict) -> tuple[dict, list[Problem]]:
    """raw with every cluster.env value that is exactly `${NAME}` taken from this shell.

    Only the whole-value form, as docker-compose does: a token stays out of the job file. The
    caller's dict is not changed (it must not come to hold the secret)."""
    cluster = raw.get("cluster")
    env = cluster.get("env") if isinstance(cluster, dict) else None
    if not isinstance(env, dict):
        return raw, []
    problems, new = [], dict(env)
    for name, value in env.items():
        m = _REF.fullmatch(value) if isinstance(value, str) else None
        if not m:
            continue
        if m[1] in os.environ:
            REF_SOURCES.add(m[1])
            # Taken literally: a `$` in it is no reference for the nodes to expand (env_refs).
            new[name] = os.environ[m[1]] if SECRET_NAME.search(str(name)) else literal_of(os.environ[m[1]])
        else:
            fix = (f"export {m[1]}=… in the shell that runs mlaunch (the value never goes into the "
                   "spec file)" if SECRET_NAME.search(str(name)) or SECRET_NAME.search(m[1])
                   else f"export {m[1]}=… or write the value")
            problems.append(Problem(f"cluster.env.{name}", f"{value} is not set in this shell: {fix}"))
    return {**raw, "cluster": {**cluster, "env": new}}, problems





def env_refs(raw: dict) -> frozenset[str]:
    """The cluster.env names whose value is a `${NAME}` reference: each one is a secret."""
    cluster = raw.get("cluster")
    env = cluster.get("env") if isinstance(cluster, dict) else None
    if not isinstance(env, dict):
        return frozenset()
    return frozenset(str(k) for k, v in env.items() if isinstance(v, str) and _REF.fullmatch(v))


def secret_env(job, name: str, value: str) -> bool:
    """Whether cluster.env's name=value is a secret: a secret's name, a `${NAME}` reference
    (any name), or a URL with a password in it."""
    return bool(SECRET_NAME.search(name) or name in job._secret_env or URL_CREDS.search(value))


def secret_values(job) -> tuple[str, ...]:
    """Every secret value of cluster.env, and every password inside a URL there; longest first."""
    secret = [(k, v) for k, v in job.cluster.env.items() if v and (SECRET_NAME.search(k) or k in job._secret_env)]
    # as written and as the node gets it: a `${NAME}` value of another name is kept with its
    # `$` doubled (env_refs.literal_of), and reaches the ranks (and their output) with one `$`
    vals = {v for _, v in secret} | {literal(k, v) for k, v in secret}
    vals |= {m[2] for v in job.cluster.env.values() for m in URL_CREDS.finditer(v)}
    return tuple(sorted(vals, key=len, reverse=True))


def mask_rules(secrets: tuple[str, ...], mark: str = "***") -> dict:
    """mask_text()'s rules as data, for a node program that masks bytes the same way
    (nodeprog/relay.py): literal [value, mark] pairs, longest first, then [pattern,
    replacement, gates...] regexes, applied where every gate substring is in the text."""
    return {"literal": [[v, mark] for v in secrets if len(v) >= 4],
            "regex": [[_alone(v), mark] for v in secrets if len(v) < 4]
            + [[URL_CREDS.pattern, rf"\g<1>{mark}\g<3>", "@", "://"]]}


def _alone(value: str) -> str:
    return rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9])"


def mask_text(text: str, secrets: tuple[str, ...], mark: str = "***") -> str:
    """text with each secret value and each URL password replaced by mark. A value shorter
    than 4 characters only where it stands alone (not inside a word): "ab" in "tab" is no leak."""
    for value in secrets:
        if len(value) >= 4:
            text = text.replace(value, mark)
        else:
            text = re.sub(_alone(value), mark, text)
    # Substring tests first: the regex scan costs ~10x more on a flood of plain lines, and
    # "@" (one character: a memchr) several times less than "://".
    return URL_CREDS.sub(rf"\g<1>{mark}\g<3>", text) if "@" in text and "://" in text else text


def mask_data(data, secrets: tuple[str, ...], mark: str = "***"):
    """data (dicts, lists, strings, numbers) with mask_text() applied to every string in it,
    keys too: the one way a structure is masked before it is printed or stored as JSON
    (masking the JSON text would miss a secret that JSON escapes)."""
    if isinstance(data, str):
        return mask_text(data, secrets, mark)
    if isinstance(data, dict):
        return {mask_data(k, secrets, mark): mask_data(v, secrets, mark) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [mask_data(v, secrets, mark) for v in data]
    return data


def check_override_secrets(overrides) -> list[Problem]:
    """A literal secret given as a command-line override (`cluster.env.X_PASSWORD=...`) sits
    in mlaunch's own argv, readable by every user in /proc, for the whole run: refused, with
    the `${NAME}` form that reads it from this shell instead."""
    out = []
    for o in overrides:
        parts = o.key.split(".")
        if parts[:2] != ["cluster", "env"] or len(parts) > 3:
            continue
        # cluster.env.NAME=value, or cluster.env={NAME: value, ...}; any type (123456 is YAML's int)
        pairs = [(parts[2], o.value)] if len(parts) == 3 else (
            list(o.value.items()) if isinstance(o.value, dict) else [])
        for name, value in pairs:
            text = "" if value is None else str(value)
            literal = text != "" and not _REF.fullmatch(text)
            if literal and (SECRET_NAME.search(str(name)) or URL_CREDS.search(text)):
                out.append(Problem(f"override {o.key}", "a secret on the command line stays in "
                                   "mlaunch's argv (/proc/<pid>/cmdline, readable by every user) "
                                   f"for the whole run; export {name}=... in this shell and write "
                                   f"cluster.env.{name}='${{{name}}}' (or {name}: ${{{name}}} in "
                                   "cluster.env)"))
    return out


# `NAME=value` in a shell line, the value as far as the line's next blank or `;`.
_SET = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S*?)(?=[\s;&|]|$)")


def check_setup_secrets(setup: list[str]) -> list[Problem]:
    """A literal secret in cluster.setup (`export API_TOKEN=abc`) is printed by the dry run and
    stored with the run's spec: refused, with cluster.env's `${NAME}` way of passing it."""
    out = []
    for i, line in enumerate(setup):
        named = [m[1] for m in _SET.finditer(line) if SECRET_NAME.search(m[1])
                 and m[2].strip("'\"") and not m[2].strip("'\"").startswith("$")]
        flag, value = _secret_flag(line)
        if flag and value.startswith("$"):
            ref = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", value)
            name = ref[1] if ref else _env_for_flag(flag)   # the variable it holds: the one to keep
            out.append(Problem(f"cluster.setup[{i}]", f"gives {flag} {value}, which the node's shell "
                               "expands onto that command's line: every user of the node reads it in "
                               f"/proc while the command runs; drop {flag} and let the tool read "
                               f"{name} from its environment (huggingface-cli and wandb do), with "
                               f"{name}: ${{{name}}} in cluster.env and {name} exported in this shell "
                               "(masked everywhere); a tool that takes it only as an argument: give it "
                               "on the tool's stdin or in a file of mode 0600 instead"))
        elif flag:
            name = _env_for_flag(flag)
            out.append(Problem(f"cluster.setup[{i}]", f"gives {flag} a literal value, which the dry "
                               "run prints and the run's record stores; put it in cluster.env as "
                               f"{name}: ${{{name}}} with {name} exported in this shell (masked "
                               f"everywhere), and drop {flag} where the tool reads {name} from its "
                               f"environment (huggingface-cli and wandb do): {flag} \"${name}\" would "
                               "put the value on that command's line, which every user of the node "
                               "reads in /proc"))
        elif named or URL_CREDS.search(line):
            what = f"sets {named[0]} to a literal value" if named else "holds a URL with a password"
            name = named[0] if named else "DATA_URL"
            out.append(Problem(f"cluster.setup[{i}]", f"{what}, which the dry run prints and the "
                               f"run's record stores; put it in cluster.env as {name}: ${{{name}}} "
                               f"with {name} exported in this shell (read from the launcher's "
                               "environment, masked everywhere)"))
    return out


def _secret_flag(line: str) -> tuple[str | None, str]:
    """The first secret-named flag of a shell line given a value (`--token X`, `--api-key=X`,
    `--token "$HF_TOKEN"`: a reference lands on the command line as much as a literal does),
    with that value as written; (None, "") when there is none."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:   # an unbalanced quote: the words as the blanks cut them
        words = line.split()
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if not eq:
            flag, value = word, words[i + 1] if i + 1 < len(words) else ""
        if flag.startswith("-") and secret_name(flag) and value and not value.startswith("-"):
            return flag, value
    return None, ""


def _env_for_flag(flag: str) -> str:
    """The variable a secret flag's value would live in: the one its tool reads, else its name."""
    key = flag.lstrip("-").replace("-", "_").lower()
    return ENV_FOR.get(key) or ("HF_TOKEN" if key in ("token", "hf_token") else key.upper())


def check_secret_refs(job) -> list[Problem]:
    """cluster.env's secrets written as the shell would ($NAME, ${NAME:-x}), which mlaunch
    passes on as those characters; a value read from this shell (`${NAME}`) is the secret
    itself, whatever characters it holds."""
    return [p for name, value in job.cluster.env.items() if SECRET_NAME.search(name)
            and name not in job._secret_env and isinstance(value, str) for p in _secret_ref(name, value)]


def _secret_ref(name: str, value: str) -> list[Problem]:
    """A secret's value that is wholly `$NAME` or `${NAME:-...}` is a reference that would reach
    the ranks as those characters (a secret is never expanded: a `$` can be part of a token);
    only the whole-value `${NAME}` is read, from the launcher's shell. The value is not echoed."""
    m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)|\$\{([A-Za-z_][A-Za-z0-9_]*)[^A-Za-z0-9_}][^}]*\}", value)
    if not m:
        return []
    ref = m[1] or m[2]
    return [Problem(f"cluster.env.{name}", f"a reference the ranks would get as those characters "
                    f"(a secret's value is never expanded on the nodes: a $ can be part of a "
                    f"token); write {name}: ${{{ref}}} to take it from the shell that runs "
                    f"mlaunch (export {ref}=... there; no default form)")]


def check_batch_secrets(job) -> list[Problem]:
    """A secret in a field that lands in the Slurm batch script (Slurm stores the script,
    `scontrol write batch_script` shows it): refused, with cluster.env as the way out."""
    c = job.cluster
    if c.scheduler != "slurm" or c.slurm is None:
        return []
    fields = {f"cluster.slurm.{k}": getattr(c.slurm, k) for k in
              ("partition", "account", "qos", "time", "constraint", "reservation")}
    fields |= {f"cluster.slurm.extra_sbatch.{k}": v for k, v in c.slurm.extra_sbatch.items()}
    fields |= {"cluster.shared_dir": c.shared_dir, "output_dir": job.output_dir}
    secrets = secret_values(job)
    out = []
    for field, value in fields.items():
        if isinstance(value, str) and value:
            why = _batch_secret(value, secrets, field)
            if why:
                out.append(Problem(field, f"{why}, and Slurm stores the batch script this lands "
                                   "in (scontrol write batch_script shows it); remove it and put "
                                   "the value in cluster.env (e.g. HF_TOKEN: ${HF_TOKEN}), which "
                                   "mlaunch hands the nodes in a 0600 file, not in the script"))
    return out


def _batch_secret(value: str, secrets: tuple[str, ...], field: str) -> str | None:
    """What in value is a secret, in words that do not repeat it; None when nothing is."""
    named = [m[1] for m in _ASSIGN.finditer(value) if SECRET_NAME.search(m[1])]
    if named:
        return f"holds {named[0]}=***, a secret"
    if URL_CREDS.search(value):
        return "holds a URL with a password"
    if mask_text(value, secrets) != value:
        return "holds the value of a cluster.env secret"
    return None

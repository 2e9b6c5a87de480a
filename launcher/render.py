"""The only producer of command and config text: jinja2 templates from templates/.

The bottom layer beside errors.py: it imports nothing of the launcher's, and every layer
above asks it for text (shell scripts, YAML, ds_config.json, the sbatch script)."""
from __future__ import annotations

import base64
import json
import os
import posixpath
import shlex
from functools import lru_cache
from typing import Any

import jinja2


def template_dir() -> str:
    """templates/ inside the installed wheel, else the repository's top-level templates/."""
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "templates"), os.path.join(os.path.dirname(here), "templates")):
        if os.path.isdir(cand):
            return cand
    raise RuntimeError("mlaunch templates are missing from the installation")


def yaml_scalar(value: Any) -> str:
    """A YAML value that PyYAML and OmegaConf both read back as the same type.

    JSON is valid YAML flow syntax, except that YAML 1.1 reads `2e-05` as a string:
    floats always get a decimal point in their mantissa.
    """
    if isinstance(value, float):
        text = repr(value)
        mantissa, _, exp = text.partition("e")
        if exp and "." not in mantissa:
            text = f"{mantissa}.0e{exp}"
        return text
    return json.dumps(value, ensure_ascii=False)


def csv(value: Any) -> Any:
    """LLaMA-Factory takes lists (datasets, lora targets) as comma-separated strings."""
    return ",".join(value) if isinstance(value, (list, tuple)) else value


class ShellVar(str):
    """A value the node's shell expands when it runs ("<prefix>${VAR}"), e.g. the node rank
    that only the scheduler knows (its rank variable); the q filter renders it quoted but expanded."""

    def __new__(cls, var: str, prefix: str = "") -> "ShellVar":
        obj = super().__new__(cls, f"{prefix}${{{var}}}")
        obj.var, obj.prefix = var, prefix
        return obj

    def shell(self) -> str:
        return (shlex.quote(self.prefix) if self.prefix else "") + f'"${{{self.var}}}"'


class NodeValue(str):
    """A cluster.env value with references the node's shell expands (spec/env_refs.py), e.g.
    /opt/x/lib:${LD_LIBRARY_PATH}; the text around them stays literal."""

    def __new__(cls, parts: list[str]) -> "NodeValue":
        text = "".join(f"${{{p}}}" if type(p) is not str else p.replace("$", "$$") for p in parts)
        obj = super().__new__(cls, text)
        obj.parts = list(parts)
        obj.refs = [p for p in parts if type(p) is not str]
        return obj

    def shell(self) -> str:
        """One shell word. A reference that ends (or starts) a path list after (before) a ':'
        adds the ':' only when the node's variable is set: no empty entry, which would mean
        the current directory in PATH and LD_LIBRARY_PATH."""
        parts, out = list(self.parts), []
        for i, p in enumerate(parts):
            if type(p) is str:
                out.append(shlex.quote(p) if p else "")
                continue
            if i == len(parts) - 1 and i > 0 and out[-1] and parts[i - 1].endswith(":"):
                out[-1] = shlex.quote(parts[i - 1][:-1]) if parts[i - 1][:-1] else ""
                out.append(f'"${{{p}:+:${{{p}}}}}"')
            elif i == 0 and len(parts) > 1 and parts[1].startswith(":"):
                out.append(f'"${{{p}:+${{{p}}}:}}"')
                parts[1] = parts[1][1:]
            else:
                out.append(f'"${{{p}}}"')
        return "".join(out) or "''"


def quote(value: Any) -> str:
    """One shell word: quoted literally, or a ShellVar's / NodeValue's expansion."""
    if isinstance(value, (ShellVar, NodeValue)):
        return value.shell()
    return shlex.quote(str(value))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """One shared jinja2 environment: strict about undefined names, no autoescape."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )
    env.filters.update(q=quote, yaml=yaml_scalar, csv=csv)
    return env


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept between runs: parsing and compiling them was most of a dry
    run's time. Per user, 0700; keyed by each template's source, so an edit recompiles.
    None (compile every time) where no such directory can be had."""
    import os
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "mlaunch", "jinja2")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:   # someone else could plant bytecode
            return None
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(path)


def render(template: str, /, **context: Any) -> str:
    """Render templates/<template> with context."""
    return environment().get_template(template).render(**context)


def node_script(**context: Any) -> str:
    """The shell text one node runs: its environment, its run directory, then exec torchrun."""
    return render("node.sh.j2", **context)


def private_dirs_script(run_dir: str, default_base: bool) -> str:
    """Shell text that makes the run dir and the dirs above it that are this user's 0700,
    refusing a link or one another user owns. Under the default base (/tmp/mlaunch-<user>)
    every level is this user's; under a workdir, <workdir>/.mlaunch is shared by its users
    (1777, sticky) and <user> below it is this user's (plan/launch_plan.py run_dir_of)."""
    up = posixpath.dirname(run_dir)
    if default_base:
        base = posixpath.dirname(up)
        return render("private_dirs.sh.j2", base=None, shared=None, dirs=[base, up, run_dir]).strip()
    shared = posixpath.dirname(up)
    return render("private_dirs.sh.j2", base=posixpath.dirname(shared), shared=shared,
                  dirs=[up, run_dir]).strip()


def stage_script(run_dir: str, default_base: bool, files: list[tuple[str, str]]) -> str:
    """private_dirs_script, then each (path, content) written 0600 on the node (one session
    a host stages in: transport/ssh.py)."""
    staged = [{"path": p, "b64": base64.encodebytes(c.encode("utf-8")).decode().strip()} for p, c in files]
    return render("stage.sh.j2", dirs=private_dirs_script(run_dir, default_base), files=staged).strip()


def sampler_script(run_id: str, every_s: float) -> str:
    """Shell text that prints a node's GPU (or CPU) figures every every_s seconds, marked for
    the live view (launcher/view/nodeview.py reads them)."""
    ms = max(100, int(every_s * 1000))
    text = render("sampler.sh.j2", run_id=run_id, every_ms=ms, every_s=f"{ms / 1000:g}")
    # Its comments stay in the template: the node script carries only the commands.
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def bootstrap(merge_stderr: bool = False, ready: str = "", staged: str = "") -> str:
    """The whole command line of every shell mlaunch starts on a node (both executors).
    merge_stderr: the node's stderr joins its stdout first (the OpenSSH client's own stderr
    is then only its own messages, transport/openssh.py); ready: a line printed first, which
    tells that the login worked before any script is sent; staged: the session first runs a
    stage frame and prints this line when it worked (templates/stage_step.sh.j2).

    It reads a length line and then exactly that many bytes of script from stdin, and
    evaluates them: the script (with cluster.env's secrets) is in no argv and no file, so
    no `ps` on any node shows it. `read` takes one byte at a time and `head -c` stops at
    the count, so whatever follows on stdin (the heartbeat) stays for the script.
    """
    return render("bootstrap.sh.j2", merge_stderr=merge_stderr, ready=ready, step=_step(staged)).strip()


def warm_frame(program: str, argv: Any, env: list[tuple[str, Any]], bindir: str | None,
               workdir: str | None) -> str:
    """A stream session's warm frame (templates/warm.sh.j2) for the node that runs argv
    (torchrun, or `python -m torch.distributed.run`): torchrun's interpreter started on
    program (nodeprog/warm.py's text) with the node's environment, to hold until its script
    hands it the launch. Sent on stdin like the script: env's secret values are in no argv
    and no file."""
    return render("warm.sh.j2", env=env, bindir=bindir, workdir=workdir, command=argv[0],
                  module=tuple(argv[1:3]) == ("-m", "torch.distributed.run"), program=program).strip()


def _step(staged: str) -> str:
    return render("stage_step.sh.j2", staged=staged).strip() if staged else ""


def relayed_bootstrap(program: str, merge_stderr: bool = False, ready: str = "", staged: str = "") -> str:
    """bootstrap() run under node program `program` (nodeprog/relay.py's text), which masks
    the node's output and copies the lines that matter to stderr; the interpreter that runs it
    is the first line sent after the ready line (templates/rbootstrap.sh.j2)."""
    return render("rbootstrap.sh.j2", program=program, bootstrap=bootstrap(merge_stderr, "", staged),
                  ready=ready).strip()


def relay_frame(config: dict) -> bytes:
    """nodeprog/relay.py's config (what to mask, what the launcher must see) as the frame it
    reads from stdin before the script: the secrets' values in no argv and no file. Entries
    of NUL-separated fields (kind, count, fields), which the relay splits without importing
    json (an import on every node session); no value here can hold a NUL (env, argv)."""
    entries = [("literal", e) for e in config.get("literal", [])] + \
        [("regex", e) for e in config.get("regex", [])] + \
        [("marks", [m]) for m in config.get("marks", [])] + \
        [("after", [m, str(n)]) for m, n in config.get("after", [])] + \
        ([("sample", [config["sample"]])] if config.get("sample") else [])
    fields = [f for kind, e in entries for f in (kind, str(len(e)), *e)]
    if any("\0" in f for f in fields):
        raise ValueError("a relay field holds a NUL byte")
    return framed("\0".join(fields))


def argv_lines(template: str, /, **context: Any) -> list[str]:
    """A command rendered ONE ARGUMENT PER LINE (templates/<template>), read back as its argv
    (split at "\n" alone: a value may hold any other character); a value the node's shell
    expands (a ShellVar, e.g. a scheduler's node rank) stays one element. A value holding a
    newline, or only blanks, is refused: it would become two arguments, or none."""
    for v in map(str, _flat(list(context.values()))):
        if "\n" in v or (v and not v.strip()):
            raise ValueError(f"an argument of {template} is {v!r}: a newline or only blanks")
    kept = {str(v): v for v in _flat(list(context.values())) if isinstance(v, ShellVar)}
    return [kept.get(a, a) for a in render(template, **context).split("\n") if a.strip()]


def _flat(items: Any) -> list[Any]:
    """The scalars of a context, lists and pairs opened."""
    return [x for i in items for x in (_flat(i) if isinstance(i, (list, tuple)) else [i])
            if x is not None]


def ssh_client_argv(**context: Any) -> list[str]:
    """The OpenSSH client's arguments up to the host (templates/ssh_client.j2 names them)."""
    return argv_lines("ssh_client.j2", **context)


def ssh_control_argv(path: str, master: bool) -> list[str]:
    """The OpenSSH client's connection-sharing arguments, ahead of ssh_client_argv's
    (templates/ssh_control.j2): master of the socket path, or a session riding it."""
    return argv_lines("ssh_control.j2", path=path, master=master)


def torchrun_argv(**context: Any) -> list[str]:
    """One node's torchrun and its options (templates/torchrun.j2)."""
    return argv_lines("torchrun.j2", **context)


def framed(script: str) -> bytes:
    """script as bootstrap() reads it from stdin: its byte length, a newline, the bytes."""
    data = script.encode("utf-8")
    return b"%d\n" % len(data) + data


def exec_script(rank: int, host: str, argv: list[str], env: list[tuple[str, str]],
                bindir: str | None, workdir: str | None, guard: bool = True) -> str:
    """`mlaunch exec`'s script for one node: the spec's environment, then argv; one argument
    is a shell command line (as pdsh runs it), several are quoted one by one (by the template:
    no value reaches the script unquoted)."""
    return render("exec.sh.j2", rank=rank, host=host, env=env, bindir=bindir, workdir=workdir,
                  argv=list(argv), guard=guard)


def drop_logs_script(dirs: list[str]) -> str:
    """Shell text that removes these torchrun log folders (templates/drop_logs.sh.j2)."""
    return render("drop_logs.sh.j2", dirs=dirs, parents=sorted({posixpath.dirname(d) for d in dirs}))


def teardown_script(match: str, pidfiles: list[str], grace: float, kill_now: bool = False,
                    agents: list[str] | None = None, drain: float = 1.0,
                    containers: list[str] | None = None, agent_logs: list[str] | None = None) -> str:
    """Shell text that ends, on one host, every process whose environment holds `match`
    (NAME=value): SIGTERM (process group first), a grace period, then SIGKILL.

    agents: the pidfiles of node agents (torchrun) among pidfiles; once only they are left
    they get `drain` seconds, not the rest of the grace (their ranks' log files keep all);
    agent_logs: the agents' --log-dir directories: the drain ends as soon as no agent holds
    a file under one (every line copied);
    containers: shell lines that remove the host's nodes' containers (cluster.container) once
    their processes are gone."""
    return render("teardown.sh.j2", match=match, pidfiles=pidfiles,
                  grace=0 if kill_now else grace, first_signal="KILL" if kill_now else "TERM",
                  agents=agents or [], drain=drain, containers=containers or [],
                  agent_logs=agent_logs or [])


def secrets_env(env: list[tuple[str, str]]) -> str:
    """The shell file that exports the secrets of cluster.env (NAME, value pairs)."""
    return render("secrets_env.sh.j2", env=env)


def stack_dump_script(match: str, pyspy: str, native: bool = True, timeout: float = 20) -> str:
    """Shell text that prints a py-spy dump of every rank process whose environment holds
    `match` (NAME=value), each behind a header line (launcher/watch/stacks.py reads it)."""
    return render("stacks.sh.j2", match=match, pyspy=pyspy, native=native, timeout=f"{timeout:g}")


def llamafactory_yaml(job: Any, run_id: str, ds_path: str | None, resume_from: str | None,
                      overwrite: bool | str | None = False, warmup: Any = None) -> str:
    """LLaMA-Factory's training YAML for job (warmup: trainers.Warmup or None)."""
    pref = job.effective_preference()
    return render("llamafactory.yaml.j2", job=job, ft=job.finetuning, tr=job.training,
                  run_id=run_id, ds_path=ds_path, resume_from=resume_from, overwrite=overwrite,
                  warmup=warmup, pref=pref, fsdp=fsdp_args(job.fsdp) if job.fsdp else None,
                  ddp_timeout=ddp_timeout(job))


def ddp_timeout(job: Any) -> int | None:
    """The collective timeout the ranks get: the spec's, else one that outlasts the startup
    limit (rank 0 preprocesses while the others wait in a barrier under this timeout), else
    None for trainers that keep their own default (ms-swift: 18000000 s)."""
    given = getattr(getattr(job, "training", None), "ddp_timeout", None)
    if given is not None:
        return given
    if job.trainer == "llamafactory":
        return max(7200, int(job.health.startup_after_s) + 600)
    return 18_000_000 if job.trainer == "swift" else None


def fsdp_args(fsdp: Any) -> dict:
    """The HF Trainer's `fsdp` option string and `fsdp_config` for a spec's fsdp section."""
    options = [fsdp.sharding] + (["auto_wrap"] if fsdp.auto_wrap else []) + (["offload"] if fsdp.offload else [])
    # use_orig_params: LoRA mixes frozen and trainable weights in one wrapped module, which
    # FSDP's flat parameters accept only with it.
    config: dict = {"use_orig_params": True}
    if fsdp.auto_wrap and fsdp.layer_cls:
        config["transformer_layer_cls_to_wrap"] = list(fsdp.layer_cls)
    if getattr(fsdp, "backward_prefetch", None):
        config["backward_prefetch"] = fsdp.backward_prefetch
    if getattr(fsdp, "cpu_ram_efficient_loading", None) is not None:
        config["cpu_ram_efficient_loading"] = fsdp.cpu_ram_efficient_loading
    return {"options": " ".join(options), "config": config}


def ds_default(ds: Any) -> dict:
    """mlaunch's default DeepSpeed config for a `deepspeed: {stage: N}` section, with "auto"
    where the spec or the model decides (launcher/spec/deepspeed.py fills them)."""
    return json.loads(render("ds_config.json.j2", ds=ds))


def ds_config(config: dict) -> str:
    """The resolved DeepSpeed config as the JSON file the nodes read."""
    return json.dumps(config, indent=2) + "\n"


def llamafactory_entry() -> str:
    """mlaunch's entry script for LLaMA-Factory under DeepSpeed (empty parameter groups removed,
    each optimizer state its own step after a universal load)."""
    return render("llamafactory_entry.py.j2")


def swift_entry() -> str:
    """mlaunch's entry script for an ms-swift attempt that loads a universal checkpoint (each
    optimizer state its own step after the load)."""
    return render("swift_entry.py.j2")


def universal_script(env, bindir: str | None, python: str, checkpoint: str, world: int,
                     container: str | None = None) -> str:
    """Shell text for node 0: convert checkpoint to DeepSpeed's universal checkpoint once,
    unless it was saved at this world (runs/universal.py reads its status line); container:
    a runtime line the conversion runs in (cluster.container)."""
    return render("universal.sh.j2", env=list(env), bindir=bindir, python=python,
                  checkpoint=checkpoint, world=int(world), container=container)


def universal_probe(checkpoint: str) -> str:
    """Shell text that prints the optimizer shards of checkpoint and the ranks that saved it
    (runs/universal.py saved_world reads its line)."""
    return render("universal_probe.sh.j2", checkpoint=checkpoint)


def python_script(python: str, source: str, args: list[str]) -> str:
    """Shell text that runs a Python source (fed on stdin) with args on a node."""
    if "\nMLAUNCH_PY_EOF\n" in source:
        raise ValueError("source contains the heredoc terminator")
    return render("pyrun.sh.j2", python=python, source=source.rstrip("\n"), args=args)


def command_line(argv: Any) -> str:
    """argv as one shell-quoted line, exactly as a node script execs it (for display)."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def container_line(runtime: str, **context: Any) -> str:
    """One node's runtime line (templates/container/<runtime>.sh.j2): the shell words before
    its torchrun, or for pyxis the options of the batch script's srun."""
    text = render(f"container/{runtime}.sh.j2", runtime=runtime, **context)
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def container_rm(command: list[str], name: str) -> str:
    """Shell text that removes one node's container by name, whatever its state."""
    return render("container/rm.sh.j2", command=command, name=name).strip()


def staging_push_argv(**context: Any) -> list[str]:
    """The launcher's rsync that copies a staged item to one node (templates/staging_push.j2)."""
    return argv_lines("staging_push.j2", **context)


def staging_pull_script(**context: Any) -> str:
    """Shell text for a node that copies a staged item from another node, or from a path of
    its own (templates/staging_pull.sh.j2)."""
    return render("staging_pull.sh.j2", **context).strip()


def tokenize_script(env, bindir: str | None, python: str, dst: str, out: str, yaml: str,
                    fingerprint: str, seal: str) -> str:
    """Shell text for one node: LLaMA-Factory tokenizes the dataset once into dst (yaml: the
    run's YAML for it, out: its throwaway output_dir), sealed with its manifest (seal: the
    manifest program's text); prints one "mlaunch-tokenize <status>" line."""
    if "\nMLAUNCH_TOKENIZE_YAML\n" in f"\n{yaml}\n":
        raise ValueError("the YAML holds the heredoc terminator")
    return render("tokenize.sh.j2", env=list(env), bindir=bindir, python=python, dst=dst, out=out,
                  yaml=yaml.rstrip("\n"), fingerprint=fingerprint, seal=seal,
                  program=render("llamafactory_tokenize.py.j2").rstrip("\n"))

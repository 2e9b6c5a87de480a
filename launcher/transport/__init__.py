"""How mlaunch reaches nodes: the only code below the backends that opens SSH sessions or
starts node processes.

Holds base (the Executor and Running interfaces, exits, staging), spool (the file a node's
stream is written into), openssh and openssh_running (an OpenSSH client per SSH node carrying
its stream and, over its shared connection, the short scripts), ssh (the SSH executor;
paramiko and fabric read ssh_config and known_hosts and explain a failed login: ssh_paramiko),
ssh_probe (logins to spare hosts), local (nodes as subprocesses of this machine), relay (the
node relay's settings).

May import: errors, render, nodeprog, spec, plan, record, view, logs, watch. Names are
imported lazily: nothing here loads fabric on `mlaunch ps`'s path.
"""

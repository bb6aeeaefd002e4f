"""The live workshop board (issue 40): which learner is stuck on which exercise check.

client   the kernel's side: after a check, post its verdict with the learner's hub token
         (standard library only; every check imports it; nothing is sent outside a hub)
store    the board's state: one entry per learner and check, who is stuck, common hints
labels   a hint kind as its template, read from the checks' source
page     the instructor's HTML page
service  the JupyterHub service (tornado + jupyterhub's HubOAuth), started by the hub

Only `client` runs in a learner's kernel; the rest runs on the hub, which needs the `hub`
extra (jupyterhub). docs/hosting.md says how to enable it, docs/instructors.md how to read it.
"""

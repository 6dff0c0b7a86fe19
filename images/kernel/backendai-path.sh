# /etc/profile.d/00-backendai-path.sh (and sourced by /etc/bash.bashrc): the kernel's
# environment first on PATH. Login shells (Jupyter terminals run `bash -l`, `su -`,
# `docker exec ... bash -l`) start from /etc/profile, which resets PATH to Debian's
# default and would drop /opt/venv/bin: `python`, `pip`, `jupyter` must stay the
# notebook's. Idempotent; a user's ~/.profile may still put ~/.local/bin before it.
case ":${PATH:-}:" in
    :/opt/venv/bin:*) ;;
    *) PATH="/opt/venv/bin${PATH:+:$PATH}" ;;
esac
export PATH
VIRTUAL_ENV=/opt/venv
export VIRTUAL_ENV

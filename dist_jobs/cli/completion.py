"""`dist-jobs completion bash|zsh`: a completion script generated from the parser itself,
so a new verb or flag completes the day it is added."""

from __future__ import annotations

import argparse

from dist_jobs.cli.argv import subcommands

SCRIPT = """# dist-jobs completion: eval "$(dist-jobs completion {shell})"
{preamble}_dist_jobs() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} opts=""
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=( $(compgen -W "{verbs}" -- "$cur") )
        return
    fi
    case "${{COMP_WORDS[1]}}" in
{cases}
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
    else
        COMPREPLY=( $(compgen -f -- "$cur") )
    fi
}}
complete -o filenames -F _dist_jobs dist-jobs
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    (sub,) = subcommands(parser)
    cases = []
    for verb, p in sub.choices.items():
        parsers = [p, *(q for action in subcommands(p) for q in action.choices.values())]
        flags = sorted(
            {o for q in parsers for a in q._actions if a.help != argparse.SUPPRESS for o in a.option_strings}
        )
        cases.append(f'        {verb}) opts="{" ".join(flags)}" ;;')
    preamble = "autoload -U +X bashcompinit && bashcompinit\n" if shell == "zsh" else ""
    return SCRIPT.format(shell=shell, preamble=preamble, verbs=" ".join(sub.choices), cases="\n".join(cases))

"""``nodehealth completion bash|zsh|fish|tcsh``: shell completion generated from the argument parser.

bash, zsh and fish are written here from the parser itself (``tree``): the subcommands, their
options, the values an option takes (its choices; the check names of the registry for ``--only``
and ``--skip``; scenario files, ``*.toml`` and the shipped ``/usr/share/nodehealth/scenarios``, for
``--simulate``; files and directories by the option's metavar). zsh runs the bash function through
its ``bashcompinit``; tcsh is shtab's (optional). Each face's script (``nodehealth-prolog`` ...) gets its
own, from ``faces/args.py``'s options and ``faces/table.py``'s rows (``face_tree``). The packages install
the first three for every command (scripts/gen-completion.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from nodehealth.probes.source import SHIPPED_SCENARIOS as SCENARIO_DIR

SHELLS = ("bash", "zsh", "fish", "tcsh")
CHECK_OPTIONS = ("--only", "--skip")
FILE_METAVARS = ("FILE", "FILE|-", "SCENARIO", "P", "PATH")
DIR_METAVARS = ("DIR", "D")
EMPTY = "''"


@dataclass(frozen=True)
class Opt:
    """One option (``flags``) or positional (no flags) and what its value completes to."""

    flags: tuple[str, ...]
    help: str
    kind: str  # "" takes no value; "words", "scenario", "file", "dir"; "value" (nothing to offer)
    words: tuple[str, ...] = ()
    many: bool = False  # nargs + or *: several values follow


@dataclass(frozen=True)
class Cmd:
    path: tuple[str, ...]
    help: str
    opts: tuple[Opt, ...]
    subs: tuple[Cmd, ...]

    def walk(self) -> list[Cmd]:
        return [self] + [c for s in self.subs for c in s.walk()]

    @property
    def key(self) -> str:
        return " ".join(self.path)


def _check_names() -> tuple[str, ...]:
    from nodehealth.registry import CHECKS

    return tuple(spec.name for spec in CHECKS)


def _opt(action: argparse.Action) -> Opt:
    flags = tuple(action.option_strings)
    help_text = " ".join((action.help or "").split()).replace("%(default)s", str(action.default))
    many = action.nargs in ("+", "*")
    if action.nargs == 0:
        return Opt(flags, help_text, "")
    if set(flags) & set(CHECK_OPTIONS):
        return Opt(flags, help_text, "words", _check_names(), many)
    if action.choices:
        return Opt(flags, help_text, "words", tuple(str(c) for c in action.choices), many)
    if "--simulate" in flags:
        return Opt(flags, help_text, "scenario", (), many)
    metavar = str(action.metavar or "")
    if metavar in DIR_METAVARS or flags and flags[-1].endswith("-dir"):
        return Opt(flags, help_text, "dir", (), many)
    if metavar in FILE_METAVARS or "--config" in flags or not flags and action.dest in ("file", "source"):
        return Opt(flags, help_text, "file", (), many)
    return Opt(flags, help_text, "value", (), many)


def tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), help_text: str = "") -> Cmd:
    """The parser as data: every subcommand with its options and what their values complete to."""
    opts: list[Opt] = []
    subs: list[Cmd] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                subs.append(tree(sub, path + (name,), " ".join(helps.get(name, "").split())))
        elif isinstance(action, argparse._HelpAction):
            opts.append(Opt(tuple(action.option_strings), "show the help and exit", ""))
        else:
            opts.append(_opt(action))
    return Cmd(path, help_text, tuple(opts), tuple(subs))


def face_tree(face: str) -> Cmd:
    """A face's command line as data (``faces/args.py``'s options): what its own script completes."""
    from nodehealth.faces.args import OPTION_TABLE
    from nodehealth.faces.table import BY_NAME

    opts = tuple(Opt(flags, text, "file" if metavar else "") for flags, metavar, text in OPTION_TABLE)
    return Cmd((), BY_NAME[face].does, opts, ())


def _bash_q(words: tuple[str, ...]) -> str:
    return "'" + " ".join(words).replace("'", "") + "'"


def bash(root: Cmd, prog: str = "nodehealth") -> str:
    fn = "_" + prog.replace("-", "_")
    descend, skip, values, many, words = [], [], [], [], []
    for cmd in root.walk():
        for sub in cmd.subs:
            descend.append(f'"{cmd.key}|{sub.path[-1]}"')
        flags = [f for o in cmd.opts for f in o.flags]
        positional = [w for o in cmd.opts if not o.flags and o.kind == "words" for w in o.words]
        posfiles = next((o.kind for o in cmd.opts if not o.flags and o.kind in ("file", "dir", "scenario")), "")
        words.append(
            f'        "{cmd.key}") subs={_bash_q(tuple(s.path[-1] for s in cmd.subs) + tuple(positional))}; '
            f"flags={_bash_q(tuple(flags))}; posfiles={posfiles or EMPTY} ;;"
        )
        for o in cmd.opts:
            if not o.flags:
                continue
            if not o.kind:
                continue
            pats = "|".join(f'"{cmd.key}|{f}"' for f in o.flags)
            skip.append(pats)
            action = {
                "words": f"{fn}_words {_bash_q(o.words)}",
                "scenario": f"{fn}_scenarios",
                "file": f"{fn}_files file",
                "dir": f"{fn}_files dir",
                "value": ":",
            }[o.kind]
            values.append(f"        {pats}) {action}; return ;;")
            if o.many and o.kind == "words":
                many.append(f"        {pats}) {action}; return ;;")
    return f"""# bash completion for {prog}, generated from its argument parser (nodehealth completion bash)
{fn}_words() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" pre=""
    case "$cur" in *,*) pre="${{cur%,*}},"; cur="${{cur##*,}}" ;; esac
    local w
    COMPREPLY=()
    for w in $(compgen -W "$1" -- "$cur"); do COMPREPLY+=("$pre$w"); done
}}
{fn}_files() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}"
    compopt -o filenames 2>/dev/null
    if [ "$1" = dir ]; then COMPREPLY=($(compgen -d -- "$cur")); else COMPREPLY=($(compgen -f -- "$cur")); fi
}}
{fn}_scenarios() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}"
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -X '!*.toml' -- "$cur") $(compgen -d -- "$cur"))
    if [ -z "$cur" ] && [ -d {SCENARIO_DIR} ]; then COMPREPLY+=({SCENARIO_DIR}/); fi
}}
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local path="" w i skip=0 last="" subs="" flags="" posfiles=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        if ((skip)); then skip=0; continue; fi
        case "$w" in -*) last="$w" ;; esac
        case "$path|$w" in
        {"|".join(descend) or '"|"'}) path="${{path:+$path }}$w"; last="" ;;
        {"|".join(skip) or '"|"'}) skip=1 ;;
        esac
    done
    case "$path|$prev" in
{chr(10).join(values)}
    esac
    case "$cur" in -*) ;; *)
        case "$path|$last" in
{chr(10).join(many)}
        esac ;;
    esac
    case "$path" in
{chr(10).join(words)}
    esac
    case "$cur" in
    -*) COMPREPLY=($(compgen -W "$flags" -- "$cur")) ;;
    *)
        if [ -n "$subs" ]; then COMPREPLY=($(compgen -W "$subs" -- "$cur"))
        elif [ "$posfiles" = scenario ]; then {fn}_scenarios
        elif [ -n "$posfiles" ]; then {fn}_files "$posfiles"
        else COMPREPLY=($(compgen -W "$flags" -- "$cur")); fi ;;
    esac
}}
complete -F {fn} {prog}
"""


def zsh(root: Cmd, prog: str = "nodehealth") -> str:
    return (
        f"#compdef {prog}\n# zsh completion for {prog}: its bash completion through zsh's bashcompinit "
        "(nodehealth completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n" + bash(root, prog)
    )


def _fish_q(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(root: Cmd, prog: str = "nodehealth") -> str:
    fn = "__" + prog.replace("-", "_")
    descend = " ".join(_fish_q(f"{c.key}|{s.path[-1]}") for c in root.walk() for s in c.subs)
    skip = " ".join(_fish_q(f"{c.key}|{f}") for c in root.walk() for o in c.opts if o.kind for f in o.flags)
    lines = [
        f"# fish completion for {prog}, generated from its argument parser (nodehealth completion fish)",
        f"function {fn}_path --description 'the subcommands on the command line so far'",
        "    set -l path ''",
        "    set -l skip 0",
        "    set -l words (commandline -opc)",
        "    set -e words[1]",
        "    for w in $words",
        "        if test $skip = 1; set skip 0; continue; end",
        f'        if contains -- "$path|$w" {descend}',
        '            set path (string trim -- "$path $w")',
        f'        else if contains -- "$path|$w" {skip}',
        "            set skip 1",
        "        end",
        "    end",
        "    echo $path",
        "end",
        f'function {fn}_at; set -l p ({fn}_path); test "$p" = "$argv[1]"; end',
        f"function {fn}_after --description 'the last option on the line is one of these'",
        "    set -l opts (string match -- '-*' (commandline -opc))",
        "    test (count $opts) -gt 0; and contains -- $opts[-1] $argv",
        "end",
        f"function {fn}_scenarios --description 'scenario files: *.toml and directories'",
        "    set -l cur (commandline -ct)",
        "    for f in $cur*",
        "        if test -d $f; echo $f/; else if string match -q -- '*.toml' $f; echo $f; end",
        "    end",
        f'    test -z "$cur"; and test -d {SCENARIO_DIR}; and echo {SCENARIO_DIR}/',
        "end",
        f"complete -c {prog} -f",
    ]
    for cmd in root.walk():
        at = f"-n {_fish_q(f'{fn}_at {_fish_q(cmd.key)}')}"
        for sub in cmd.subs:
            lines.append(f"complete -c {prog} {at} -a {sub.path[-1]} -d {_fish_q(sub.help)}")
        for o in cmd.opts:
            value = {
                "": "",
                "words": f" -x -a {_fish_q(' '.join(o.words))}",
                "scenario": f" -x -a '({fn}_scenarios)'",
                "file": " -r -F",
                "dir": " -x -a '(__fish_complete_directories)'",
                "value": " -x",
            }[o.kind]
            if not o.flags:
                if o.kind == "words":
                    lines.append(f"complete -c {prog} {at} -a {_fish_q(' '.join(o.words))}")
                elif o.kind in ("file", "scenario", "dir"):
                    lines.append(f"complete -c {prog} {at} -F")
                continue
            names = " ".join(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}" for f in o.flags)
            lines.append(f"complete -c {prog} {at} {names}{value} -d {_fish_q(o.help)}")
            if o.many and o.kind == "words":
                after = f"{fn}_at {_fish_q(cmd.key)}; and {fn}_after {' '.join(o.flags)}"
                lines.append(f"complete -c {prog} -n {_fish_q(after)} -a {_fish_q(' '.join(o.words))}")
    return "\n".join(lines) + "\n"


WRITERS = {"bash": bash, "zsh": zsh, "fish": fish}


def face_scripts() -> dict[str, str]:
    """Each face's console script -> its face (``nodehealth-prolog`` -> ``prolog``), from ``faces/table.py``."""
    from nodehealth.faces.table import FACES

    return {face.script: face.name for face in FACES}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion",
        help="print shell completion for nodehealth (bash, zsh, fish, tcsh)",
        description="Print a completion script generated from nodehealth's own argument parser: subcommands, "
        "options, check names for --only, scenario files for --simulate; with --for, a face's own (its "
        "options, files for --config). The packages install bash's, zsh's and fish's for every command; by "
        "hand: nodehealth completion bash > /etc/bash_completion.d/nodehealth",
    )
    p.add_argument("shell", choices=SHELLS)
    p.add_argument(
        "--for",
        dest="command",
        metavar="COMMAND",
        choices=("nodehealth", *face_scripts()),
        default="nodehealth",
        help="the command to complete: nodehealth (default) or a face's script (bash, zsh, fish)",
    )
    p.set_defaults(func=run)


def face_script(face: str, name: str) -> str:
    """The completion script in shell ``name`` (bash, zsh, fish) of a face's own command."""
    from nodehealth.faces.table import BY_NAME

    return WRITERS[name](face_tree(face), BY_NAME[face].script)


def script(parser: argparse.ArgumentParser, name: str) -> str:
    if name in WRITERS:
        return WRITERS[name](tree(parser), parser.prog or "nodehealth")
    import shtab

    text: str = shtab.complete(parser, name)  # the shell, positionally
    return text


def run(args: argparse.Namespace) -> int:
    face = face_scripts().get(args.command)
    if face is not None and args.shell not in WRITERS:
        print(f"nodehealth: --for {args.command}: bash, zsh or fish only", file=sys.stderr)
        return 2
    try:
        text = face_script(face, args.shell) if face is not None else script(args.root_parser, args.shell)
    except ImportError:
        print(
            "nodehealth: tcsh completion needs the shtab package (pip install 'nodehealth[completion]')",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0

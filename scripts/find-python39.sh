#!/usr/bin/env bash
# Prints the path of a working Python 3.9 interpreter (RHEL 9's version), or nothing.
for p in "$HOME"/.pyenv/versions/3.9*/bin/python /usr/bin/python3.9 /usr/local/bin/python3.9 \
         "$(command -v python3.9 2>/dev/null)"; do
    [ -n "$p" ] && [ -x "$p" ] || continue
    if "$p" -c 'import sys; assert sys.version_info[:2] == (3, 9)' 2>/dev/null; then
        echo "$p"
        exit 0
    fi
done

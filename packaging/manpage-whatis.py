"""Give each generated man page a whatis entry: ``NAME`` then ``name \\- summary`` (lintian's
bad-whatis-entry), the summary being the first sentence of its DESCRIPTION. Used by the package
builds on the pages scripts/gen-man.py wrote.

  python3 packaging/manpage-whatis.py PAGE...
"""

import re
import sys

for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = lines.index(".SH NAME") + 1
    if " \\- " not in lines[i]:
        d = lines.index(".SH DESCRIPTION") + 1
        text = re.sub(r"\\f[BIRP]", "", lines[d]) if d < len(lines) else ""
        summary = re.split(r"(?<=[.;:])\s", text, maxsplit=1)[0].rstrip(".;:") or "nodehealth"
        lines[i] = f"{lines[i]} \\- {summary}"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))

# Sourced by the scripts that make Debian roots (fresh-check.sh,
# container-check.sh): this machine's apt sources, read as apt reads them.
# source_entries: "URI SUITE" for every enabled binary ("deb") entry, from the
# one-line files and the deb822 .sources files.
source_entries() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" {
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        print $i, $(i + 1)
      }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'function flush(  n, m, a, b, u, s) {
           if (types ~ /(^| )deb( |$)/ && enabled != "no") {
             n = split(uris, u, " "); m = split(suites, s, " ")
             for (a = 1; a <= n; a++) for (b = 1; b <= m; b++) print u[a], s[b]
           }
           types = uris = suites = enabled = ""
         }
         /^[ \t]*#/ { next }
         /^[ \t]*$/ { flush(); next }
         /^[A-Za-z-]+:/ {
           key = tolower($0); sub(/:.*/, "", key)
           val = $0; sub(/^[^:]*:[ \t]*/, "", val)
           if (key == "types") types = val
           else if (key == "uris") uris = val
           else if (key == "suites") suites = val
           else if (key == "enabled") enabled = tolower(val)
         }
         END { flush() }' "$f"
  done
}

#!/usr/bin/env bash
# Fails (exit 1, printing the lines) when tracked files narrate how the product was made
# instead of describing it: sessions and their ordinals, "the issue's" targets, scratch paths,
# references to the checkout's sibling directory ../shared, links to the removed run log.
#
#   bash scripts/check_narration.sh [PATHSPEC...]     # default: the whole tree
#
# Checks (case-insensitive, git grep -I over tracked text files, this script excluded):
#   1. the project's hook: "<ordinal|this|last|next|previous|earlier|later> session", the
#      issue's stated target, the scratch directory's path (the patterns below spell them with
#      a character class, so that this file does not match itself);
#   2. the word "session" anywhere else in prose, once the names that legitimately contain it
#      are taken out of the line: gpu_session (scripts/gpu_session.sh, its functions and work
#      directory), session.log (a file that script writes), and library identifiers
#      (InferenceSession, SessionOptions, requests.Session);
#   3. "the issue's" (the task the code was written for is not part of the product);
#   4. "../shared" and "shared/seed", "shared/peer", "shared/SPEC" (files outside the
#      repository);
#   5. performance_log.md (replaced by docs/design/);
#   6. calendar dates (YYYY-MM-DD) in the documentation (*.md): a measurement names the commit
#      or tree it ran on; when it ran is git's history.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

SELF=scripts/check_narration.sh
if [ $# -gt 0 ]; then SPEC=("$@"); else SPEC=(.); fi
# .gitignore names ignored paths, it is not prose.
PATHS=(-- "${SPEC[@]}" ":(exclude)$SELF" ":(exclude).gitignore")

ORDINALS='first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth|twentieth|[0-9]+(st|nd|rd|th)|this|last|next|previous|earlier|later'
HOOK="(${ORDINALS}) session|the issue.s targe[t]|\\.scr[a]tch/"
OTHER="the issue'?s\\b|\\.\\./shared|(^|[^a-z_])shared/(seed|peer|spec)|performance_log\\.md"

found=0
report() {  # $1: title; stdin: git grep lines
  local lines
  lines=$(cat)
  if [ -n "$lines" ]; then
    echo "narration check: $1"
    printf '%s\n' "$lines"
    found=1
  fi
}

report "session ordinals, stated targets, scratch paths" \
  < <(git grep -I -n -i -E "$HOOK" "${PATHS[@]}")
report "the issue's, ../shared, the removed run log" < <(git grep -I -n -i -E "$OTHER" "${PATHS[@]}")
# Bare "session": strip the allowed names from the text after "path:line:", then look again.
report "the word session" < <(git grep -I -n -i -E 'session' "${PATHS[@]}" | awk '
  {
    text = $0
    sub(/^[^:]*:[0-9]+:/, "", text)
    gsub(/[A-Za-z0-9_]*gpu_session[A-Za-z0-9_.]*/, "", text)
    gsub(/session\.log/, "", text)
    gsub(/InferenceSession|SessionOptions|requests\.Session/, "", text)
    if (tolower(text) ~ /session/) print $0
  }')
report "dates in the documentation" \
  < <(git grep -I -n -E '(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]' "${PATHS[@]}" | grep -E '^[^:]*\.md:')

exit $found

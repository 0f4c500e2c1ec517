mkdir inbox
for f in zeta.txt Alpha.txt beta.txt 10-notes.txt 9-notes.txt _draft.txt Zed.txt; do echo "$f" > "inbox/$f"; done

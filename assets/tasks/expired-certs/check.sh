cd /work
[ -f expired.txt ] || { echo "no expired.txt"; exit 1; }
today=$(date +%F)
want=$(for f in certs/*; do d=$(sed -n 's/^expires: //p' "$f"); [[ "$d" < "$today" ]] && basename "$f"; done | sort)
got=$(sed 's/^certs\///; s/[[:space:]]*$//' expired.txt | grep -v '^$')
[ "$got" = "$want" ] || { echo "expired.txt has [$(echo $got)], expected [$(echo $want)]"; exit 1; }
echo "ok"

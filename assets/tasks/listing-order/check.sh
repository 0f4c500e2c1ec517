cd /work
[ -f listing.txt ] || { echo "no listing.txt"; exit 1; }
want=$(ls inbox)
got=$(grep -v '^$' listing.txt | sed 's/^inbox\///')
[ "$got" = "$want" ] || { echo "listing.txt is [$(echo $got)], ls gives [$(echo $want)]"; exit 1; }
echo "ok"

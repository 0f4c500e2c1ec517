today=$(date +%F)
for f in certs/*; do
  d=$(grep '^expires:' "$f" | cut -d' ' -f2)
  if [[ "$d" < "$today" ]]; then basename "$f"; fi
done | sort > expired.txt

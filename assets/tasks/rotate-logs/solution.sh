cutoff=$(date -d "-7 days" +%F)
for f in logs/app-*.log; do
  d=${f#logs/app-}; d=${d%.log}
  if [[ "$d" < "$cutoff" ]]; then rm -- "$f"; fi
done

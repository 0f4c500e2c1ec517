mkdir incoming
# mktemp -u draws its name from getrandom, which the sandbox seeds from (run seed, step),
# so the name is random per run yet the same on replay. (mktemp without -u mixes in the
# real monotonic clock and is not reproducible.)
f=incoming/$(mktemp -u upload-XXXXXXXX)
echo "payload $RANDOM" > "$f"
chmod 644 "$f"

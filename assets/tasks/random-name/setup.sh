mkdir incoming
f=$(mktemp incoming/upload-XXXXXXXX)
echo "payload $RANDOM" > "$f"
chmod 644 "$f"

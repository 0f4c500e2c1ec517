for f in cache.tmp build.tmp upload-1.tmp upload-2.tmp; do echo scratch > "$f"; done
echo "quarterly numbers" > report.txt
echo "a,b,c" > data.csv
echo "keep me" > notes.tmp.txt

cd /work/incoming || { echo "incoming/ is gone"; exit 1; }
files=$(ls -A)
[ "$files" = "upload.dat" ] || { echo "incoming/ holds [$(echo $files)], expected only upload.dat"; exit 1; }
grep -q '^payload [0-9]*$' upload.dat || { echo "upload.dat is not the uploaded file"; exit 1; }
echo "ok"

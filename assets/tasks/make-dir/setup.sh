echo "remember to back up the database" > notes.txt

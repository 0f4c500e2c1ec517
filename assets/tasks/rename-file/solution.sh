mv draft.txt final.txt

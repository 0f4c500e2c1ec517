echo "greeting.txt should say hello world" > README

chmod +x deploy.sh

mkdir certs
for spec in api.pem:-120 billing.pem:40 cdn.pem:-3 mail.pem:2 vpn.pem:-1 www.pem:365; do
  name=${spec%%:*}; days=${spec##*:}
  printf 'subject: %s\nexpires: %s\n' "${name%.pem}.example.com" "$(date -d "$days days" +%F)" > "certs/$name"
done

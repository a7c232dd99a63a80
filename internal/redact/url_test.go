package redact

import "testing"

func TestURL(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"handler with basic auth", "http://app:s3cret@127.0.0.1:8080/events", "http://app:xxxxx@127.0.0.1:8080/events"},
		{"rabbitmq with vhost", "amqp://guest:guest@127.0.0.1:5672/orders", "amqp://guest:xxxxx@127.0.0.1:5672/orders"},
		{"percent-encoded password", "amqps://u:p%40ss%2Fw@h/", "amqps://u:xxxxx@h/"},
		{"empty password", "http://app:@h/", "http://app:xxxxx@h/"},
		{"user only", "http://app@h/events", "http://app@h/events"},
		{"no userinfo", "http://127.0.0.1:8080/events", "http://127.0.0.1:8080/events"},
		{"kafka broker", "127.0.0.1:9092", "127.0.0.1:9092"},
		{"empty", "", ""},
		{"password with an unescaped @", "http://app:p@ss@h/x", "http://app:xxxxx@h/x"},
		{"password with an unescaped /: does not parse", "http://app:ab/cd@h/events", "http://app:xxxxx@h/events"},
		{"password with an unescaped /: parses as a port", "http://app:1234/5678@h/events", "http://app:xxxxx@h/events"},
		{"password with an unescaped ?", "http://app:12?34@h/events", "http://app:xxxxx@h/events"},
		{"password with an unescaped #", "http://app:12#34@h/events", "http://app:xxxxx@h/events"},
		{"password with a space", "http://app:my pass@h/", "http://app:xxxxx@h/"},
		{"bad escape", "http://app:p%zz@h/", "http://app:xxxxx@h/"},
		{"no scheme", "app:s3cret@h:8080", "app:xxxxx@h:8080"},
		{"no slashes", "amqp:guest:s3cret@h", "amqp:xxxxx@h"},
		{"email in the query only", "http://h/x?mail=a@b.example", "http://h/x?mail=a@b.example"},
		{"port and an @ later: masked from the port on", "http://h:80/x?mail=a@b.example", "http://h:xxxxx@b.example"},
		{"query secrets", "http://h/x?a=1&token=t0k&API_Key=k3y&Password=p&b=2", "http://h/x?a=1&token=xxxxx&API_Key=xxxxx&Password=xxxxx&b=2"},
		{"escaped query name", "http://h/x?access%5Ftoken=t0k", "http://h/x?access%5Ftoken=xxxxx"},
		{"query after userinfo", "amqp://u:p@h/?sasl_password=s&heartbeat=10", "amqp://u:xxxxx@h/?sasl_password=xxxxx&heartbeat=10"},
		{"fragment secret", "https://h/cb#access_token=t0k&state=1", "https://h/cb#access_token=xxxxx&state=1"},
		{"secret-named parameter without a value", "http://h/x?token", "http://h/x?token"},
		{"monkey is a key too: masked, the safe side", "http://h/x?monkey=1", "http://h/x?monkey=xxxxx"},
		{"a scheme only after the userinfo", "u:s3cret@h/x?next=http://y", "u:xxxxx@h/x?next=http://y"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := URL(tt.in); got != tt.want {
				t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if got := URL(URL(tt.in)); got != tt.want {
				t.Errorf("URL twice = %q, want %q", got, tt.want)
			}
		})
	}
}

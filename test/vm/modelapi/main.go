// Command modelapi is the scripted model API `make vm-test` runs inside the
// VM (internal/modelapi on a loopback port): the VM's gateway turn talks to
// it, and it logs, for each request, its path and whether it carried the
// real key from -key-file (never the key itself).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18080", "address to listen on")
	keyFile := flag.String("key-file", "", "file holding the real key the gateway must send")
	flag.Parse()
	key, err := os.ReadFile(*keyFile)
	if err != nil {
		log.Fatalf("modelapi: %v", err)
	}
	// A request that offers no tools gets modelapi.SideText.
	api := modelapi.New()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("modelapi: %v", err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		match := bytes.Equal([]byte(r.Header.Get("X-Api-Key")), bytes.TrimSpace(key))
		fmt.Printf("request %s %s realkey=%v\n", r.Method, r.URL.Path, match)
		api.ServeHTTP(w, r)
	})
	log.Fatal(http.Serve(ln, handler))
}

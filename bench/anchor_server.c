/* The scrape bench's floor: a single-threaded C server that answers every request on
 * 127.0.0.1:PORT with one of two prebuilt HTTP responses (gzip when the request says "gzip"),
 * then closes the connection if the request says "Connection: close", else reads the next request
 * on it (keep-alive, as Prometheus scrapes; one connection at a time). No parsing beyond the end
 * of the header, no allocation per request: what is left of a scrape's time is the loopback's,
 * the kernel's and the client's.
 *
 *     cc -O2 -o anchor_server anchor_server.c && ./anchor_server PORT plain.http gzip.http
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(2); }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s PORT PLAIN GZIP\n", argv[0]); return 2; }
    size_t plain_len, gzip_len;
    char *plain = slurp(argv[2], &plain_len), *zipped = slurp(argv[3], &gzip_len);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[1]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 64)) { perror("bind/listen"); return 2; }
    char req[8192];
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        for (;;) { /* each request on the connection, until the client closes it or asks to */
            size_t got = 0;
            while (got < sizeof req - 1) {
                ssize_t r = read(c, req + got, sizeof req - 1 - got);
                if (r <= 0) break;
                got += (size_t)r;
                req[got] = 0;
                if (strstr(req, "\r\n\r\n")) break;
            }
            req[got] = 0;
            if (!strstr(req, "\r\n\r\n")) break;
            if (strstr(req, "gzip")) send_all(c, zipped, gzip_len);
            else send_all(c, plain, plain_len);
            if (strstr(req, "Connection: close")) break;
        }
        close(c);
    }
}

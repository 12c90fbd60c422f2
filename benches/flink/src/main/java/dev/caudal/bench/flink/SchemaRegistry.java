package dev.caudal.bench.flink;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * The two calls of the Confluent schema registry API the Kafka bench needs, over
 * java.net.http (Confluent's client is not on Maven Central; Apicurio's ccompat API, e.g.
 * http://127.0.0.1:18081/apis/ccompat/v7, answers them like Caudal's RegistryClient
 * (schemas/src/registry.rs) expects):
 * <ul>
 *   <li>{@code POST {url}/subjects/{subject}/versions} with {@code {"schema": "<json>"}}
 *       → {@code {"id": N}} (idempotent: an already registered schema keeps its id);</li>
 *   <li>{@code GET {url}/schemas/ids/{id}} → {@code {"schema": "<json>"}}.</li>
 * </ul>
 * Failed attempts (I/O, HTTP 5xx, Apicurio's 409 race on a subject's first version) are made
 * again, up to 6 times in about 3 s.
 */
final class SchemaRegistry implements Serializable {
    private static final long serialVersionUID = 1L;
    private static final String CONTENT_TYPE = "application/vnd.schemaregistry.v1+json";
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final int ATTEMPTS = 6;

    private final String baseUrl;
    private transient HttpClient http;

    SchemaRegistry(String baseUrl) {
        this.baseUrl = baseUrl.endsWith("/") ? baseUrl.substring(0, baseUrl.length() - 1) : baseUrl;
    }

    String baseUrl() {
        return baseUrl;
    }

    /** Registers {@code schemaJson} under {@code subject}; returns its global id. */
    int register(String subject, String schemaJson) throws IOException {
        String body = JSON.writeValueAsString(JSON.createObjectNode().put("schema", schemaJson));
        HttpRequest request = HttpRequest
                .newBuilder(URI.create(baseUrl + "/subjects/" + segment(subject) + "/versions"))
                .timeout(Duration.ofSeconds(30))
                .header("Content-Type", CONTENT_TYPE)
                .header("Accept", CONTENT_TYPE + ", application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8))
                .build();
        JsonNode id = call(request).get("id");
        if (id == null || !id.canConvertToInt()) {
            throw new IOException("POST " + request.uri() + ": the answer has no \"id\"");
        }
        return id.intValue();
    }

    /** The schema JSON with global id {@code id}. */
    String schemaById(int id) throws IOException {
        HttpRequest request = HttpRequest.newBuilder(URI.create(baseUrl + "/schemas/ids/" + id))
                .timeout(Duration.ofSeconds(30))
                .header("Accept", CONTENT_TYPE + ", application/json")
                .GET()
                .build();
        JsonNode schema = call(request).get("schema");
        if (schema == null || !schema.isTextual()) {
            throw new IOException("GET " + request.uri() + ": the answer has no \"schema\"");
        }
        return schema.textValue();
    }

    private JsonNode call(HttpRequest request) throws IOException {
        if (http == null) {
            http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();
        }
        String what = request.method() + " " + request.uri();
        IOException last = null;
        for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
            if (attempt > 0) {
                sleep(100L << attempt);
            }
            HttpResponse<String> resp;
            try {
                resp = http.send(request, HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
            } catch (IOException e) {
                last = new IOException(what + ": " + e, e);
                continue;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IOException(what + ": interrupted", e);
            }
            int status = resp.statusCode();
            if (status >= 200 && status < 300) {
                return JSON.readTree(resp.body());
            }
            last = new IOException(what + " -> HTTP " + status + ": " + truncate(resp.body()));
            boolean retry = status >= 500 || (status == 409 && request.method().equals("POST")
                    && resp.body().contains("already exists"));
            if (!retry) {
                break;
            }
        }
        throw last;
    }

    private static String segment(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }

    private static String truncate(String s) {
        return s.length() <= 300 ? s : s.substring(0, 300) + "…";
    }

    private static void sleep(long ms) throws IOException {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted", e);
        }
    }
}

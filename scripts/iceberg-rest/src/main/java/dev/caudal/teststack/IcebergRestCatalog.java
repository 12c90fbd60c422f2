package dev.caudal.teststack;

import java.io.FileReader;
import java.io.IOException;
import java.io.Reader;
import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

/**
 * The test stack's Iceberg REST catalog: Iceberg's REST servlet in front of the catalog that
 * a properties file describes, listening on one address only.
 *
 * <pre>java -cp 'libs/*' dev.caudal.teststack.IcebergRestCatalog catalog.properties</pre>
 *
 * <p>Keys of the file: {@code rest.host} and {@code rest.port} (where to listen),
 * {@code catalog.name} (the backing catalog's name: the JDBC catalog's {@code catalog_name}
 * column), and every other key is a property of that catalog ({@code catalog-impl},
 * {@code uri}, {@code warehouse}, {@code io-impl}, {@code s3.endpoint}, ...).
 */
public final class IcebergRestCatalog {
  private IcebergRestCatalog() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: IcebergRestCatalog CATALOG_PROPERTIES_FILE");
      System.exit(2);
    }
    Map<String, String> props = read(args[0]);
    String host = required(props, "rest.host");
    int port = Integer.parseInt(required(props, "rest.port"));
    String name = required(props, "catalog.name");
    // No Hadoop configuration: JDBC catalog and S3FileIO need none.
    Catalog catalog = CatalogUtil.buildIcebergCatalog(name, props, null);

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    Server server = new Server(new InetSocketAddress(host, port));
    server.setHandler(context);
    server.setStopAtShutdown(true);
    server.start();
    System.err.printf(
        "iceberg-rest: catalog %s (%s, warehouse %s) at http://%s:%d%n",
        name, props.get("uri"), props.get("warehouse"), host, port);
    server.join();
  }

  private static Map<String, String> read(String path) throws IOException {
    Properties p = new Properties();
    try (Reader r = new FileReader(path)) {
      p.load(r);
    }
    Map<String, String> out = new HashMap<>();
    for (String k : p.stringPropertyNames()) {
      out.put(k, p.getProperty(k));
    }
    return out;
  }

  private static String required(Map<String, String> props, String key) {
    String v = props.get(key);
    if (v == null || v.isBlank()) {
      throw new IllegalArgumentException("missing " + key + " in the catalog properties");
    }
    return v;
  }
}
